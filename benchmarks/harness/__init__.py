"""What the benchmarks share (the plan-safety runs, device data); not part of the package.

Benchmark scripts import it as ``harness`` (their own directory is on ``sys.path``); the tests
find it through pytest's ``pythonpath = ["benchmarks"]``.
"""

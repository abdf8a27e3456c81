"""Every built-in operator, float32 and float64, input from a Dask graph, a Zarr store (and for
GST3D a SEG-Y file): does the memory-bound plan run with 0 pauses and 0 deaths?

    python benchmarks/plan_safety.py                    # the whole matrix (~30 min on 2 cores)
    python benchmarks/plan_safety.py --only std median  # some operators
    python benchmarks/plan_safety.py --issue            # issue 17's reproduction only

Each case runs on a fresh ``LocalCluster`` of 2 workers x 1 thread, with the largest memory
limit (of ``xarray_memchunk.experiments.plan_safety.LIMITS``) at which the plan's binding
constraint is memory. Shapes and chunkings are ones no calibration profiled. Prints a Markdown
table and writes it to ``benchmarks/results/plan_safety.md``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from pathlib import Path

from xarray_memchunk.experiments.plan_safety import SafetyCase, format_table, run_case, summary

CUBE = {"time": 2100, "lat": 500, "lon": 600}
VOLUME = {"inline": 320, "crossline": 320, "sample": 320}
TALL = {"time": 40000, "y": 40, "x": 50}
WIDE = {"time": 8000, "y": 100, "x": 300}

REDUCTIONS = ["sum", "mean", "std", "var", "min", "max", "median", "quantile"]


def matrix(only: list[str] | None) -> list[SafetyCase]:
    cases = []
    for dtype in ("float32", "float64"):
        for op in REDUCTIONS:
            kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
            cases.append(
                SafetyCase(op, dtype, CUBE, {"time": 2100, "lat": 50, "lon": 300}, "graph", kwargs)
            )
            cases.append(
                SafetyCase(op, dtype, CUBE, {"time": 100, "lat": 250, "lon": 300}, "file", kwargs)
            )
        for kernel in ("gaussian", "d2geo"):
            kwargs = {"kernel": kernel}
            cases.append(
                SafetyCase("gst3d", dtype, VOLUME, dict.fromkeys(VOLUME, 160), "graph", kwargs)
            )
            cases.append(
                SafetyCase("gst3d", dtype, VOLUME, dict.fromkeys(VOLUME, 64), "file", kwargs)
            )
        seismic = dict.fromkeys(VOLUME, 64)
        cases.append(SafetyCase("gst3d", dtype, VOLUME, seismic, "segy", {"kernel": "gaussian"}))
        exact = {"sample_dims": "time", "method": "exact"}
        two_pass = exact | {"tsqr": "two-pass"}
        for source, kwargs, label in (
            ("graph", exact, ""),
            ("graph", two_pass, "svd-two-pass"),
            ("file", two_pass, "svd-two-pass"),
        ):
            tall_chunks = {"time": 5000, "y": 40, "x": 50}
            cases.append(SafetyCase("svd", dtype, TALL, tall_chunks, source, kwargs, label=label))
        cases.append(
            SafetyCase(
                "svd",
                dtype,
                WIDE,
                {"time": 1000, "y": 100, "x": 300},
                "file",
                {"sample_dims": "time", "method": "compressed", "k": 10},
            )
        )
    if only:
        cases = [c for c in cases if c.op in only or c.name in only]
    return cases


def issue_cases() -> list[SafetyCase]:
    """Issue 17: a float32 cube on 2 x 1 GB workers, time whole, two input chunkings."""
    return [
        SafetyCase(op, "float32", CUBE, chunks, "graph", {"dim": "time"}, "1GB", f"{op} (issue 17)")
        for chunks in ({"time": 2100, "lat": 50, "lon": 300}, {"time": 2100, "lat": 50, "lon": 600})
        for op in ("std", "median")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="operator names (or labels) to run")
    parser.add_argument("--issue", action="store_true", help="issue 17's reproduction only")
    parser.add_argument("--no-issue", action="store_true", help="skip issue 17's reproduction")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_safety.md"))
    args = parser.parse_args()
    cases = ([] if args.no_issue else issue_cases()) + ([] if args.issue else matrix(args.only))
    results = []
    with tempfile.TemporaryDirectory() as root:
        for i, case in enumerate(cases, 1):
            result = run_case(case, Path(root))
            results.append(result)
            print(f"[{i}/{len(cases)}] " + format_table([result]).splitlines()[-1], flush=True)
    table = format_table(results)
    line = summary(results)
    print("\n" + table + "\n\n" + line)
    header = (
        f"Measured {datetime.date.today()} on {platform.node() or 'this machine'} "
        f"({platform.machine()}, Python {platform.python_version()}) with "
        f"`python {' '.join(sys.argv)}`: 2 workers x 1 thread per case, a fresh LocalCluster each."
    )
    Path(args.out).write_text(header + "\n\n" + table + "\n\n" + line + "\n")


if __name__ == "__main__":
    main()

"""Measuring memory: calibrating operators, and what a run on a cluster really used.

- :mod:`~xarray_memchunk.measure.calibrate`: profile an operator's tasks and fit its memory
  model (``xarray_memchunk.calibrate``).
- :mod:`~xarray_memchunk.measure.self_calibration`: measure a user's function on growing blocks
  the first time it is planned, and fit its model.
- :mod:`~xarray_memchunk.measure.task_peaks`: the worker plugin that records each task's peak.
- :mod:`~xarray_memchunk.measure.runs`: a run's report, measured against its plan, and what the
  run teaches the memory model.
"""

"""Measure the peak memory of one operator task inside a Dask worker process.

Method: before the task, the worker's resident set size (``VmRSS``) is read and the kernel's
high-water mark (``VmHWM``) is reset by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0).
The task then creates its (padded) input, runs the operator and drops everything; the peak is
``VmHWM - VmRSS_before``. The kernel updates ``VmHWM`` on every page it maps, so no peak is
missed however short, and every allocator (numpy, scipy's C buffers, BLAS) is seen. This is the
figure ``/usr/bin/time -v`` prints as "Maximum resident set size", minus the worker's idle
baseline; a bare process's max RSS differs from it by the interpreter and imports (~100-150 MB),
which a worker already holds (``benchmarks/model_accuracy.py --compare-bare`` measures both).

Where ``clear_refs`` cannot be written (not Linux, or forbidden), a thread samples the RSS every
0.5 ms instead and reports the largest sample: it can miss peaks shorter than that.

Run inside a worker (not a bare Python), the task sees the worker's allocator settings (the
nanny sets ``MALLOC_TRIM_THRESHOLD_``) and the memory Dask itself holds around a task.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TaskProfile", "measure_task", "peak_method", "profile_tasks"]


@dataclass(frozen=True)
class TaskProfile:
    """Peak memory and time of one task shape, over repeated runs.

    Attributes
    ----------
    extents
        Padded input extents per dim.
    dtype
        Input dtype.
    peak_bytes
        Median peak above the worker's baseline over the runs.
    peak_spread
        Largest minus smallest peak over the runs.
    seconds
        Median wall time of the task.
    runs
        Number of runs.
    method
        ``"hwm"`` (kernel high-water mark) or ``"sampling"``.
    """

    extents: dict[str, int]
    dtype: str
    peak_bytes: int
    peak_spread: int
    seconds: float
    runs: int
    method: str


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_method() -> str:
    """``"hwm"`` where the kernel high-water mark can be reset here, else ``"sampling"``."""
    try:
        _status_kb("VmHWM")
    except OSError:
        return "sampling"
    return "hwm" if _reset_hwm() else "sampling"


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _Sampler:
    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(0.0005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def measure_task(
    operator, extents: Mapping[str, int], dtype: str, kwargs: Mapping[str, Any], seed: int = 0
) -> tuple[int, float, str]:
    """Run one task of ``operator`` on fresh random data of ``extents`` in this process.

    ``operator`` is an operator object (anything with ``normalize_kwargs``, ``dim_uses`` and
    ``compute``), shipped to the worker by value.

    Returns
    -------
    peak_bytes, seconds, method
        Peak resident memory above the baseline before the input existed, wall time of the
        operator call, and the measuring method.
    """
    import dask
    import xarray as xr

    op = operator
    kwargs = op.normalize_kwargs(**kwargs)
    dims = list(extents)
    shape = tuple(int(extents[d]) for d in dims)
    _trim()
    method = peak_method()
    before = _status_kb("VmRSS") if method == "hwm" else 0
    if method == "hwm":
        _reset_hwm()
    sampler = _Sampler() if method == "sampling" else None
    if sampler is not None:
        sampler.__enter__()
        before = sampler._process.memory_info().rss
    try:
        rng = np.random.default_rng(seed)
        data = rng.standard_normal(shape, dtype=np.float64 if dtype == "float64" else np.float32)
        data = data.astype(dtype, copy=False)
        da = xr.DataArray(data, dims=dims)
        uses = op.dim_uses(da, **kwargs)
        start = time.perf_counter()
        # an operator may build a one-block Dask graph (svd_compressed): run it in this thread
        with dask.config.set(scheduler="synchronous"):
            result = op.compute(da, uses, **kwargs)
            result.load()
        seconds = time.perf_counter() - start
        del result, da, data
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
    peak = (_status_kb("VmHWM") if method == "hwm" else sampler.peak) - before
    _trim()
    return max(0, int(peak)), seconds, method


def profile_tasks(
    client,
    operator,
    shapes: list[Mapping[str, int]],
    dtype: str,
    kwargs: Mapping[str, Any] | None = None,
    repeats: int = 3,
) -> list[TaskProfile]:
    """Profile ``operator`` on each task shape inside a worker of ``client``'s cluster.

    Every run goes to the same worker, one at a time (``pure=False``), so runs do not overlap.
    Use a cluster of one worker with one thread and no memory limit pressure for calibration.
    """
    worker = next(iter(client.scheduler_info()["workers"]))
    profiles = []
    for extents in shapes:
        runs = [
            client.submit(
                measure_task,
                operator,
                dict(extents),
                dtype,
                dict(kwargs or {}),
                seed,
                pure=False,
                workers=[worker],
            ).result()
            for seed in range(repeats)
        ]
        peaks = sorted(r[0] for r in runs)
        profiles.append(
            TaskProfile(
                extents={k: int(v) for k, v in extents.items()},
                dtype=dtype,
                peak_bytes=int(np.median(peaks)),
                peak_spread=int(peaks[-1] - peaks[0]),
                seconds=float(np.median([r[1] for r in runs])),
                runs=repeats,
                method=runs[0][2],
            )
        )
    return profiles

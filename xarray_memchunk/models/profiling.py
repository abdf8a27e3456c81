"""Measure the peak memory of one task inside a Dask worker process.

Method: before the task, the worker's resident set size (``VmRSS``) is read and the kernel's
high-water mark (``VmHWM``) is reset by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0).
The task then runs (creating its input, as the task in the real graph does) and drops
everything; the peak is ``VmHWM - VmRSS_before``. The kernel updates ``VmHWM`` on every page it
maps, so no peak is missed however short, and every allocator (numpy, scipy's C buffers, BLAS)
is seen. This is the figure ``/usr/bin/time -v`` prints as "Maximum resident set size", minus
the worker's idle baseline; a bare process's max RSS differs from it by the interpreter and
imports (~100-150 MB), which a worker already holds
(``benchmarks/model_accuracy.py --compare-bare`` measures both).

Where ``clear_refs`` cannot be written (not Linux, or forbidden), a thread samples the RSS every
0.5 ms instead and reports the largest sample: it can miss peaks shorter than that.

On a GPU (:func:`measure_device_peak`) the peak is the device memory CuPy's memory pool held:
the pool is emptied before the task and keeps every block it allocates until it is emptied
again, so what it holds after the task is the most the task had on the device at once,
fragmentation included: what a CUDA out-of-memory error is raised against.

What runs is a plain callable: this module knows nothing of operators. The callables that
build and compute an operator's task graph live in :mod:`xarray_memchunk.measure.calibrate`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Seconds between checks that the worker measuring a task is still there.
_ALIVE_CHECK_SECONDS = 2.0

__all__ = [
    "HeapSeries",
    "RssSampler",
    "TaskProfile",
    "freeze_heap",
    "frozen_heap",
    "measure_device_peak",
    "measure_peak",
    "measures_here",
    "measuring_worker",
    "peak_method",
    "profile_in_worker",
    "release_freed_memory",
    "reset_high_water_mark",
    "resident_bytes",
    "status_bytes",
    "thaw_heap",
    "trim_allocator",
]


@dataclass(frozen=True)
class TaskProfile:
    """Peak memory and time of one task shape, over repeated runs.

    Attributes
    ----------
    extents
        Chunk extents per dim (unpadded: the planner adds halos where the operator has them).
    sizes
        Length per dim of the array the task belongs to (the extents for a one-chunk array).
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
    sizes: dict[str, int] = field(default_factory=dict)


def status_bytes(name: str) -> int:
    """A size field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in bytes.

    Raises
    ------
    OSError
        Where there is no such file or field (not Linux).
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{name} not in /proc/self/status")


def reset_high_water_mark() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_method() -> str:
    """``"hwm"`` where the kernel high-water mark can be reset here, else ``"sampling"``."""
    try:
        status_bytes("VmHWM")
    except OSError:
        return "sampling"
    return "hwm" if reset_high_water_mark() else "sampling"


def release_freed_memory() -> None:
    """Collect garbage and hand the allocator's freed pages back to the system (glibc).

    Inside :func:`measure_peak`'s run the collection walks only what that run made
    (``gc.freeze``).
    """
    gc.collect()
    trim_allocator()


def trim_allocator() -> None:
    """Hand the allocator's freed pages back to the system (glibc's ``malloc_trim``)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def resident_bytes() -> int:
    """The resident memory of this process, freed memory handed back first; 0 where unknown."""
    release_freed_memory()
    try:
        return status_bytes("VmRSS")
    except OSError:
        return 0


class RssSampler:
    """Largest RSS of this process seen by a thread polling every ``interval`` seconds.

    Used where the high-water mark cannot be reset (every 0.5 ms), and to watch a client
    process during a whole computation.
    """

    def __init__(self, interval: float = 0.0005) -> None:
        import psutil

        self.interval = interval
        self._process = psutil.Process()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def measure_peak(run: Callable[..., Any], *args: Any) -> tuple[int, float, str]:
    """Call ``run(*args)`` in this process and measure its peak resident memory.

    ``run`` must create everything it needs and return nothing large (its result is dropped
    before the measurement ends).

    Returns
    -------
    peak_bytes, seconds, method
        Peak resident memory above the baseline before the call, wall time of the call, and
        the measuring method.
    """
    # in a series of measurements (frozen_heap) the heap's older objects are frozen: this
    # collection then walks only what is newer
    series = _FROZEN_SERIES.is_set()
    release_freed_memory()
    method = peak_method()
    # the collection after the call walks only what the call made (a full one takes 0.1-0.2 s
    # in a worker): what lived before it and died during it is collected by the next full one
    # (alone, before the next baseline is read; in a series, after it is thawed); the peak
    # measured can only be the higher for it
    gc.freeze()
    try:
        if method == "hwm":
            before = status_bytes("VmRSS")
            reset_high_water_mark()
            start = time.perf_counter()
            result = run(*args)
            seconds = time.perf_counter() - start
            del result
            peak = status_bytes("VmHWM") - before
        else:
            with RssSampler() as sampler:
                start = time.perf_counter()
                result = run(*args)
                seconds = time.perf_counter() - start
                del result
            peak = sampler.peak - sampler.baseline
        release_freed_memory()
    finally:
        if not series:
            gc.unfreeze()
    return max(0, int(peak)), seconds, method


#: Set while this process measures a series of blocks in a frozen heap (:func:`freeze_heap`).
_FROZEN_SERIES = threading.Event()


def freeze_heap() -> int:
    """Collect garbage once, then freeze what survives (``gc.freeze``) until :func:`thaw_heap`.

    Each :func:`measure_peak` collects before it reads its baseline; a full collection walks
    every object of a worker (0.1-0.2 s with xarray and flox imported, most of a small
    block's measurement). Frozen, the older objects are skipped, and each measurement leaves
    what it froze frozen until the series ends.

    Returns
    -------
    int
        The resident memory after the collection (:func:`resident_bytes`): what the process
        held before the series.
    """
    resident = resident_bytes()
    gc.freeze()
    _FROZEN_SERIES.set()
    return resident


def thaw_heap() -> int:
    """End :func:`freeze_heap`'s series: every object is collectable again, and collected.

    Returns
    -------
    int
        The resident memory after the collection (:func:`resident_bytes`): what the series
        left held.
    """
    _FROZEN_SERIES.clear()
    gc.unfreeze()
    return resident_bytes()


def _on_worker(client, worker: str, func: Callable[[], Any]) -> Any:
    """Run ``func`` in ``worker``'s process now, beside its tasks, not queued behind them."""
    if hasattr(client, "ncores"):  # distributed: Client.run, on the worker's own thread
        return client.run(func, workers=[worker])[worker]
    return client.submit(func).result()  # a ProbeProcess runs one call at a time


@dataclass
class HeapSeries:
    """What the measuring process held before and after :func:`frozen_heap`'s series.

    Read as the series starts and ends, each after a full collection: the rise is what running
    the operator leaves in a worker (a function that imports flox imports numba: about 90 MiB).

    Attributes
    ----------
    before, after
        Resident bytes of the measuring process; 0 where not measurable (no
        ``/proc/self/status``), and ``after`` stays 0 where the worker could not be thawed.
    """

    before: int = 0
    after: int = 0


@contextlib.contextmanager
def frozen_heap(client) -> Iterator[HeapSeries]:
    """Freeze the heap of the worker that :func:`profile_in_worker` measures in, for a series.

    Its older objects are frozen while the block yields (:func:`freeze_heap`) and thawed
    after (:func:`thaw_heap`), also where a measurement failed. A worker that left the cluster
    meanwhile is left alone; one that is there but cannot be thawed is warned of.

    Yields
    ------
    HeapSeries
        The worker's resident memory before the series; ``after`` is set once it is thawed.
    """
    worker = measuring_worker(client)
    series = HeapSeries(before=int(_on_worker(client, worker, freeze_heap)))
    try:
        yield series
    finally:
        try:
            series.after = int(_on_worker(client, worker, thaw_heap))
        except Exception as exc:
            if worker in _workers(client):
                warnings.warn(
                    f"the worker {worker} that measured the operator could not be thawed "
                    f"after its measurements ({type(exc).__name__}: {exc}): it keeps objects "
                    f"frozen from garbage collection until it restarts",
                    RuntimeWarning,
                    stacklevel=3,
                )


def measure_device_peak(run: Callable[..., Any], *args: Any) -> tuple[int, float, str]:
    """Call ``run(*args)`` in this process and measure its peak device memory (CuPy's pool).

    As :func:`measure_peak`, for tasks on the current GPU; the method is ``"cupy-pool"``.
    """
    import cupy

    pool = cupy.get_default_memory_pool()
    device = cupy.cuda.Device()
    gc.collect()
    device.synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    start = time.perf_counter()
    result = run(*args)
    device.synchronize()
    seconds = time.perf_counter() - start
    del result
    peak = pool.total_bytes() - before
    gc.collect()
    pool.free_all_blocks()
    return max(0, int(peak)), seconds, "cupy-pool"


def profile_in_worker(
    client,
    run: Callable[..., Any],
    cases: Sequence[tuple[dict[str, int], dict[str, int], tuple[Any, ...]]],
    dtype: str,
    repeats: int = 3,
    measure: Callable[..., tuple[int, float, str]] = measure_peak,
) -> list[TaskProfile]:
    """Measure ``run(*args, seed)`` for each case inside one worker of ``client``'s cluster.

    Parameters
    ----------
    client
        A ``distributed.Client``; every run goes to its first worker, one at a time
        (``pure=False``), so runs do not overlap. Use one worker with one thread and no
        memory limit.
    run
        Module-level callable (shipped by reference); called as ``run(*args, seed)``.
    cases
        ``(extents, sizes, args)`` per task shape; ``extents`` and ``sizes`` label the
        profile.
    dtype
        Input dtype, recorded in the profiles.
    repeats
        Runs per case, with seeds ``0 .. repeats - 1``; the median peak is kept.
    measure
        :func:`measure_peak` (host memory) or :func:`measure_device_peak` (GPU memory).
    """
    worker = measuring_worker(client)
    profiles = []
    for extents, sizes, args in cases:
        runs = [
            _result_while_alive(
                client,
                client.submit(measure, run, *args, seed, pure=False, workers=[worker]),
                worker,
                extents,
            )
            for seed in range(repeats)
        ]
        peaks = sorted(r[0] for r in runs)
        profiles.append(
            TaskProfile(
                extents={k: int(v) for k, v in extents.items()},
                sizes={k: int(v) for k, v in sizes.items()},
                dtype=dtype,
                peak_bytes=int(np.median(peaks)),
                peak_spread=int(peaks[-1] - peaks[0]),
                seconds=float(np.median([r[1] for r in runs])),
                runs=repeats,
                method=runs[0][2],
            )
        )
    return profiles


def measures_here(client) -> bool:
    """Whether :func:`profile_in_worker` measures in this very process.

    So it does on a cluster of threads in this process (``LocalCluster(processes=False)``):
    what this process does meanwhile (an import) is then part of what is measured. A
    :class:`~xarray_memchunk.models.probe_process.ProbeProcess` is always another process.
    """
    if not hasattr(client, "ncores"):
        return False
    worker = measuring_worker(client)
    return client.run(os.getpid, workers=[worker])[worker] == os.getpid()


#: Seconds :func:`profile_in_worker` waits for a worker to join a cluster that has none.
WORKER_WAIT_SECONDS = 60.0


def measuring_worker(client) -> str:
    """The worker :func:`profile_in_worker` measures in: the cluster's first one.

    Waits up to :data:`WORKER_WAIT_SECONDS` for one to join a cluster that has none.
    """
    return _workers(client, wait=WORKER_WAIT_SECONDS)[0]


def _workers(client, wait: float = 0.0) -> list[str]:
    """The cluster's worker addresses, asked of its scheduler now.

    ``ncores`` asks the scheduler; ``scheduler_info()`` may return the client's cached
    identity, which lists no worker (a self-calibrating plan once failed to find one, on a
    cluster whose two workers were running). With ``wait``, up to that many seconds for one to
    join where none is there. A :class:`ProbeProcess` names its own.
    """
    if not hasattr(client, "ncores"):
        return list(client.scheduler_info()["workers"])
    workers = list(client.ncores())
    if not workers and wait:
        client.wait_for_workers(1, timeout=wait)
        workers = list(client.ncores())
    return workers


def _result_while_alive(client, future, worker: str, extents: dict) -> Any:
    """``future.result()``; a ``MeasuringWorkerDiedError`` if ``worker`` leaves the cluster first.

    A run pinned to one worker never starts elsewhere: if that worker dies (the nanny kills it
    past its memory limit), the scheduler would hold the run forever and the plan would hang.
    """
    from ..errors import MeasuringWorkerDiedError

    if not hasattr(future, "status"):  # a ProbeProcess's run: done, or raised, already
        return future.result()
    while True:
        try:
            return future.result(timeout=_ALIVE_CHECK_SECONDS)
        except TimeoutError:
            if worker not in _workers(client):
                future.cancel()
                shape = " x ".join(f"{d}={n}" for d, n in extents.items())
                raise MeasuringWorkerDiedError(
                    f"the worker measuring the operator on a block of {shape} died (it may "
                    f"have run out of memory): give the operator a memory_model, or calibrate "
                    f"it on a cluster with more memory per worker"
                ) from None

"""A function's first run in each worker of a cluster, before its plan counts what they hold.

Running a function the first time imports what it needs and fills caches, and a worker keeps
them: a function that groups with flox imports numba, 80-90 MiB. Self-calibration measures that
rise in its measuring process
(:meth:`~xarray_memchunk.models.calibration.Calibration.held_after_running`), but a process that
had imported those libraries for earlier work measures less than a fresh worker keeps. A plan
made from such a calibration on fresh workers paused them on its first run: a groupby anomaly
calibrated after a flox groupby measured 7.19 MiB, fresh workers of 2 x 2 threads kept 90.13
MiB after their first tasks, and the run paused 22-26 times with every task within its
prediction.

:func:`first_run_rise` runs the function once, on a small block
(:data:`~xarray_memchunk.measure.calibrate.WARM_UP_ELEMENTS` elements of the array's
proportions, generated values, the data's coordinates), in each worker of the cluster that has
not run it yet, and returns how much that raised the largest worker's resident memory, each
read after a collection (:func:`~xarray_memchunk.models.profiling.resident_bytes`). The plan
counts it in its baseline before it chooses chunks. A worker that ran the function already (an
earlier plan) holds what it kept, and the baseline reads that.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..models.profiling import resident_bytes
from ..operators import Operator
from ..planning.problem import DimRole
from .calibrate import WARM_UP_ELEMENTS, growing_shapes, run_task

__all__ = ["FIRST_RUN_SECONDS", "first_run_rise", "run_first_time"]

#: Seconds :func:`first_run_rise` waits for the workers' first runs; a worker busy with other
#: work past them is left out (its run cancelled), and the plan counts what calibration and
#: earlier runs measured.
FIRST_RUN_SECONDS = 15.0

#: The calibration keys of the functions this process ran once (:func:`run_first_time`).
_RUN_HERE: set[str] = set()
_RUN_HERE_LOCK = threading.Lock()
#: ``(worker address, calibration key)`` of each worker known to have run the function: a
#: plan on workers that all have asks none of them again (0.08 s a plan on 2 workers).
_RAN_IN: set[tuple[str, str]] = set()


def run_first_time(
    key: str,
    operator: Operator,
    kwargs: Mapping[str, Any],
    extents: Mapping[str, int],
    dtype: str,
    coords: Mapping[str, tuple[tuple[str, ...], np.ndarray]],
) -> tuple[int, int] | None:
    """In a worker: run ``operator`` once on a block of ``extents``, unless it ran here before.

    Returns
    -------
    tuple of int or None
        The process's resident memory before and after the run, each read after a collection;
        both read now where this process ran the function of ``key`` before (it holds what it
        kept). None where the function failed on the block (its plan's tasks say so when they
        run).
    """
    with _RUN_HERE_LOCK:
        ran = key in _RUN_HERE
        _RUN_HERE.add(key)
    before = resident_bytes()
    if ran:
        return before, before
    try:
        run_task(operator, kwargs, extents, extents, dtype, 0, coords=coords)
    except Exception:
        return None
    return before, resident_bytes()


def first_run_rise(
    operator: Operator,
    da: Any,
    kwargs: Mapping[str, Any],
    key: str,
    client: Any,
    timeout: float = FIRST_RUN_SECONDS,
) -> int | None:
    """How much running ``operator`` first raises the cluster's largest worker memory, now.

    Each worker of ``client``'s cluster that has not run the function of calibration ``key``
    runs it once on a small block of ``da``'s dims, dtype and coordinates
    (:func:`run_first_time`), all at once; the others say what they hold. The rise is the
    largest worker's memory after the runs less the largest before, at least 0: fresh workers
    rise by all their first run keeps, and one fresh worker beside one that ran the function
    already (its memory above the other's already) raises it by no more than what it outgrows
    that one by. None where the cluster has no worker, where each worker ran the function
    already as far as this process knows, or where no worker answered within ``timeout``
    seconds (one busy with other work is left out, its run cancelled).
    """
    from distributed import wait

    workers = list(client.ncores())
    if all((worker, key) in _RAN_IN for worker in workers):  # none, or all ran it
        return None
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    uses = operator.dims(da, **kwargs)
    whole = [d for d, u in uses.items() if u.role is DimRole.WHOLE]
    extents = next(growing_shapes(sizes, whole, start=WARM_UP_ELEMENTS))
    coords = {
        str(name): (dims, np.asarray(coord.values)[tuple(slice(0, extents[d]) for d in dims)])
        for name, coord in da.coords.items()
        if set(dims := tuple(map(str, coord.dims))) <= set(extents)
    }
    token = uuid.uuid4().hex
    futures = [
        client.submit(
            run_first_time,
            key,
            operator,
            dict(kwargs),
            extents,
            np.dtype(da.dtype).name,
            coords,
            key=f"memchunk-first-run-{token}-{i}",
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )
        for i, worker in enumerate(workers)
    ]
    try:
        wait(futures, timeout=timeout)
    except TimeoutError:
        pass
    answers = [f.result() for f in futures if f.status == "finished"]
    client.cancel([f for f in futures if not f.done()])
    ran = zip(workers, futures, strict=True)
    _RAN_IN.update((worker, key) for worker, future in ran if future.status == "finished")
    held = [a for a in answers if a is not None]
    if not held:
        return None
    return max(0, max(after for _, after in held) - max(before for before, _ in held))

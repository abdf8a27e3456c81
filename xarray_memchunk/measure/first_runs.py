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
(:data:`~xarray_memchunk.measure.self_calibration.WARM_UP_ELEMENTS` elements of the array's
proportions, generated values, the data's coordinates), in each worker of the cluster that has
not run it yet, and returns how much that raised the largest worker's resident memory, each
read after a collection (:func:`~xarray_memchunk.models.profiling.resident_bytes`). The plan
counts it in its baseline before it chooses chunks. Where every worker had run the function
already (an earlier plan or run), they hold what they kept, the baseline reads that, and the
plan does not add it again (:attr:`FirstRuns.ran_before`).
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..models.profiling import resident_bytes
from ..operators import Operator
from ..planning.problem import DimRole
from .calibrate import run_task, worker_statuses
from .self_calibration import WARM_UP_ELEMENTS, growing_shapes

__all__ = ["FIRST_RUN_SECONDS", "FirstRuns", "first_run_rise", "run_first_time"]

#: Seconds :func:`first_run_rise` waits for the workers' first runs. A worker that has not
#: answered by then (busy with other work, paused, or a first call that compiles for long) is
#: left out: its run is not waited for by a later plan either, and Dask cannot stop it once it
#: has started.
FIRST_RUN_SECONDS = 15.0

#: The calibration keys of the functions this process ran once (:func:`run_first_time`).
_RUN_HERE: set[str] = set()
_RUN_HERE_LOCK = threading.Lock()
#: ``(scheduler, worker address, calibration key)`` of each worker asked to run the function
#: (it did, or it was left out): a plan on workers that all were asks none of them again (0.08 s
#: a plan on 2 workers, and no second wait for a worker left out).
_ASKED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class FirstRuns:
    """What the workers' first runs of a function raised the largest worker's memory by.

    Attributes
    ----------
    rise
        Bytes: the largest worker's memory after the runs less the largest before, at least 0.
    ran_before
        Whether every worker had run the function before (nothing ran now): their memory, which
        the plan's baseline reads, holds what they kept already.
    """

    rise: int
    ran_before: bool


def run_first_time(
    key: str,
    operator: Operator,
    kwargs: Mapping[str, Any],
    extents: Mapping[str, int],
    dtype: str,
    coords: Mapping[str, tuple[tuple[str, ...], np.ndarray]],
    needs: float = 0.0,
) -> tuple[int, int, bool] | None:
    """In a worker: run ``operator`` once on a block of ``extents``, unless it ran here before.

    Not where the block is predicted to need more (``needs`` bytes) than the worker has room
    for below its pause threshold (:func:`_room_here`): the plan cannot fit there, and the run
    would pause or kill the worker.

    Returns
    -------
    tuple or None
        The process's resident memory before and after the run (each read after a
        collection), and whether it had run the function of ``key`` before (both read now: it
        holds what it kept). None where the function failed on the block (its plan's tasks say
        so when they run), where other tasks ran in the worker meanwhile (their memory would
        be counted as the function's), or where the worker has no room for the block.
    """
    before = resident_bytes()
    with _RUN_HERE_LOCK:
        ran = key in _RUN_HERE
        if not ran and needs > _room_here(before):
            return None
        _RUN_HERE.add(key)
    if ran:
        return before, before, True
    if _others_running():
        return None
    try:
        run_task(operator, kwargs, extents, extents, dtype, 0, coords=coords)
    except Exception:
        return None
    after = resident_bytes()
    return None if _others_running() else (before, after, False)


def _room_here(held: int) -> float:
    """Bytes below the pause threshold of the worker this runs in, holding ``held`` bytes.

    Inf where it has no threshold, or this is not a worker.
    """
    try:
        from distributed import get_worker

        manager = get_worker().memory_manager
    except Exception:  # not in a worker, or a distributed that does not say
        return math.inf
    limit, pause = manager.memory_limit, manager.memory_pause_fraction
    if not limit or not pause:
        return math.inf
    return pause * limit - held


def _others_running() -> bool:
    """Whether the worker this runs in executes another task beside this one."""
    try:
        from distributed import get_worker

        return get_worker().state.executing_count > 1
    except Exception:  # not in a worker, or a distributed that does not say
        return False


def first_run_rise(
    operator: Operator,
    da: Any,
    kwargs: Mapping[str, Any],
    key: str,
    client: Any,
    timeout: float = FIRST_RUN_SECONDS,
    predicted_peak: Callable[[Mapping[str, int]], float] | None = None,
) -> FirstRuns | None:
    """How much running ``operator`` first raises the cluster's largest worker memory, now.

    Each worker of ``client``'s cluster that has not run the function of calibration ``key``
    runs it once on a small block of ``da``'s dims, dtype and coordinates
    (:func:`run_first_time`), all at once; the others say what they hold. The rise is the
    largest worker's memory after the runs less the largest before, at least 0: fresh workers
    rise by all their first run keeps, and one fresh worker beside one that ran the function
    already (its memory above the other's already) raises it by no more than what it outgrows
    that one by. A worker where other tasks ran meanwhile is not counted, nor a paused one (it
    would run nothing). None where the cluster has no running worker, where no worker answered
    within ``timeout`` seconds, or for an asynchronous client (planning does not wait on one).
    ``predicted_peak``: the function's model, bytes of a block of these extents; a worker with
    less room than that for the block does not run it (:func:`run_first_time`).
    """
    from distributed import wait

    if getattr(client, "asynchronous", False):
        return None
    workers = list(client.ncores())
    scheduler = str(getattr(client.scheduler, "address", ""))
    if workers and all((scheduler, worker, key) in _ASKED for worker in workers):
        return FirstRuns(0, ran_before=True)
    statuses = worker_statuses(client)
    workers = [w for w in workers if statuses.get(w) != "paused"]  # they would run nothing
    if not workers:
        return None
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    uses = operator.dims(da, **kwargs)
    whole = [d for d, u in uses.items() if u.role is DimRole.WHOLE]
    extents = next(growing_shapes(sizes, whole, start=WARM_UP_ELEMENTS))
    coords = {
        str(name): (dims, np.asarray(coord.isel({d: slice(0, extents[d]) for d in dims}).values))
        for name, coord in da.coords.items()
        if set(dims := tuple(map(str, coord.dims))) <= set(extents)
    }
    needs = 0.0 if predicted_peak is None else float(predicted_peak(extents))
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
            needs,
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
    client.cancel([f for f in futures if not f.done()])  # those not started yet
    _ASKED.update((scheduler, worker, key) for worker in workers)
    held = [a for a in answers if a is not None]
    if not held:
        return None
    rise = max(after for _, after, _ in held) - max(before for before, _, _ in held)
    return FirstRuns(max(0, rise), ran_before=all(ran for _, _, ran in held))

"""What a worker holds beside a plan's tasks, counted in the budget's baseline.

The baseline of a :class:`~xarray_memchunk.memory_limits.Budget` is a worker's memory when the
plan is made. Running an operator may leave more there: a self-calibrated function's imports
after its first run (:func:`held_after_running`, :func:`first_run_rises`), the netCDF chunk
caches of the files a graph reads (:func:`held_in_chunk_caches`). Compiled code loaded in
this process, or in every worker, already is not counted twice (:func:`without_loaded_runtime`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import xarray as xr

from .clusters import active_client, ask_workers
from .errors import BudgetError, CalibrationError, InfeasiblePlanError
from .measure.first_runs import FirstRuns, first_run_rise
from .memory_limits import Budget, configured_baseline
from .models.fitting import ABSOLUTE_SLACK
from .models.learned import load_kept, record_kept
from .operators import Operator, chunk_caches
from .operators.cost import TaskCost
from .operators.production import production_ahead
from .planning.budget import format_size, with_baseline
from .planning.footprint import InputKind
from .planning.problem import PlanProblem

__all__ = [
    "first_run_rises",
    "held_after_running",
    "held_in_chunk_caches",
    "held_in_shared_production",
    "without_loaded_runtime",
]


def held_after_running(
    budget: Budget,
    operator: Operator,
    costs: Mapping[str, TaskCost],
    first_runs: Mapping[str, FirstRuns],
):
    """``budget`` for workers that keep what running ``operator`` leaves in them.

    A self-calibrated function's calibration records how much its runs raised the measuring
    process's memory (:meth:`~xarray_memchunk.models.calibration.Calibration.held_after_running`):
    imports such as flox's numba stay in the worker after the first task. A run may have
    measured a fresh worker keeping more (:func:`~xarray_memchunk.models.learned.load_kept`:
    the calibration was measured in a process that had those imports already), and so may the
    workers' first runs of it while planning (``first_runs``, :func:`first_run_rises`). The
    largest is added to the baseline: to the workers' memory now where they have not run the
    function; where each had run it before (:attr:`FirstRuns.ran_before`), their memory holds
    it already, and the baseline is the larger of that and the configured one plus the figure
    (a worker that joins later starts from a fresh one's memory). Where that makes a worker hold
    more between tasks than the budget's baseline, the baseline is raised to it.
    """
    if budget.device != "cpu":
        return budget
    idle = budget.worker_baseline
    largest, source = 0, ""
    for cost in costs.values():
        calibrated = None if cost.calibration is None else cost.calibration.held_after_running(0)
        if calibrated is None:
            continue
        first = first_runs.get(cost.calibration_key)
        ran = f"a worker's memory once it has run {operator.name!r}"
        figures = [(calibrated, f"{ran}, measured calibrating it")]
        if first is not None and not first.ran_before:
            rise = budget.format(first.rise)
            why = (
                f"{ran}: {rise} more after its first run, measured in a worker that had not run it"
            )
            figures.append((first.rise, why))
        kept = load_kept(cost.calibration_key, cost.device)
        if kept is not None:
            size = budget.format(kept)
            why = f"{ran}: {size} kept after its first tasks, measured by an earlier run or plan"
            figures.append((kept, why))
        figure, why = max(figures, key=lambda f: f[0])  # the first of equals
        if first is not None and first.ran_before:
            held = max(idle, configured_baseline() + figure)
        else:
            held = idle + figure
        if held > largest:
            largest, source = held, why
    return _raised_baseline(budget, operator, largest, source)


def _raised_baseline(
    budget: Budget,
    operator: Operator,
    baseline: int,
    source: str,
    remedy: str = "",
    *,
    filled: bool = False,
) -> Budget:
    """:func:`with_baseline`, its ``BudgetError`` a refusal that names ``source`` and ``remedy``.

    A refusal like any other: the alternatives are tried. Its minimum is room for a task, which
    :func:`~xarray_memchunk.refusals.checked_minimum` plans before stating it.
    """
    try:
        return with_baseline(budget, baseline, source, remedy, filled=filled)
    except BudgetError as exc:
        raise InfeasiblePlanError(
            f"{operator.name!r}: {exc}" + (f"; or {remedy}" if remedy else ""),
            minimum_memory_limit=exc.minimum_memory_limit,
        ) from None


def held_in_chunk_caches(
    budget: Budget,
    operator: Operator,
    targets: Mapping[str, xr.DataArray],
    costs: Mapping[str, TaskCost],
    problem: PlanProblem,
) -> tuple[Budget, PlanProblem]:
    """``budget`` for workers that keep the chunk caches of the netCDF4 files a graph reads.

    Variables produced by a Dask graph (:attr:`InputKind.GRAPH`) read their files through
    xarray, whose netCDF4 files keep each variable's decompressed chunks
    (:mod:`~xarray_memchunk.operators.chunk_caches`): the baseline is raised by what a worker
    may still fill, and the problem gets a note that says how to keep none.
    """
    graph_inputs = [
        targets[name] for name, cost in costs.items() if cost.layout.kind is InputKind.GRAPH
    ]
    if budget.device != "cpu" or not graph_inputs:
        return budget, problem
    caches = chunk_caches.held_in_chunk_caches(graph_inputs, configured_baseline())
    if not caches.nbytes:
        return budget, problem
    here = budget.threaded_scheduler or budget.in_this_process  # the files open here
    holder = "this process keeps" if here else "a worker keeps"
    source = f"netCDF chunk caches ({format_size(caches.nbytes)}) {holder} reading the input"
    baseline = budget.worker_baseline + caches.nbytes
    remedy = chunk_caches.chunk_cache_remedy(here)
    raised = _raised_baseline(budget, operator, baseline, source, remedy, filled=True)
    if raised is budget:  # a per_task given by hand: nothing counted, nothing to note
        return budget, problem
    note = chunk_caches.chunk_cache_note(caches, here)
    return raised, replace(problem, notes=(*problem.notes, note))


def held_in_shared_production(
    budget: Budget, costs: Mapping[str, TaskCost], problem: PlanProblem
) -> tuple[dict[str, TaskCost], PlanProblem]:
    """``costs`` and ``problem`` counting the production that blocks share, held ahead.

    A graph whose blocks share their production (``.chunk(time=30)`` of one-year chunks read
    from files: :attr:`~xarray_memchunk.operators.production.InputProduction.shared`) keeps
    each year in a worker until its last block is made, while the scheduler sends the worker
    other years' reads: each task slot counts
    :func:`~xarray_memchunk.operators.production.production_ahead` times what making a block
    holds. A new user's groupby of ``open_mfdataset`` files so chunked, on 2 workers of 2
    threads, held three years' reads in a worker at once: 391 MiB above it while staging,
    where two slots of 160 MiB were counted, and 381 MiB running ``method="map-reduce"``
    against 301 MiB.
    """
    shared = {
        name: cost
        for name, cost in costs.items()
        if cost.production is not None and cost.production.shared and cost.layout.produce_bytes
    }
    if budget.device != "cpu" or not shared:
        return dict(costs), problem
    ahead = production_ahead(budget.threads_per_worker)
    if ahead <= 1.0:
        return dict(costs), problem
    raised = {
        name: replace(
            cost, layout=replace(cost.layout, produce_bytes=ahead * cost.layout.produce_bytes)
        )
        for name, cost in shared.items()
    }
    layouts = {cost.layout.name: raised[n].layout for n, cost in shared.items()}
    inputs = tuple(layouts.get(layout.name, layout) for layout in problem.inputs)
    note = (
        f"{', '.join(shared)}: blocks cut from the same larger chunks of the input's graph "
        f"share their production, which a worker keeps until the last of them is made while "
        f"it is sent more of the graph's first tasks (up to x{ahead:g} per thread, at the "
        f"scheduler's worker-saturation): each task slot counts x{ahead:g} what making one "
        f"block holds"
    )
    return dict(costs) | raised, replace(problem, inputs=inputs, notes=(*problem.notes, note))


def first_run_rises(
    operator: Operator,
    targets: Mapping[str, xr.DataArray],
    costs: Mapping[str, TaskCost],
    kwargs: Mapping[str, Any],
    budget: Budget,
    measure: str,
) -> dict[str, FirstRuns]:
    """What a self-calibrated function's first run raised fresh workers' memory by, now.

    On a budget read from a distributed client's workers, each worker that has not run the
    function runs it once on a small block
    (:func:`~xarray_memchunk.measure.first_runs.first_run_rise`): its calibration may have been
    measured in a process that held its libraries already, and counted less than fresh workers
    keep. The first rise measured above the calibration's own is kept beside it
    (:func:`~xarray_memchunk.models.learned.record_kept`), so that a plan on the next cluster
    counts it too; a later one is not (a run raises it where a worker paused:
    :func:`~xarray_memchunk.measure.runs.report`). Calibration keys to what was measured;
    nothing with ``measure="never"``.
    """
    if measure == "never" or budget.device != "cpu" or not budget.read_from_cluster:
        return {}
    client = active_client()
    if client is None:
        return {}
    measured: dict[str, FirstRuns] = {}
    for name, cost in costs.items():
        key, calibration = cost.calibration_key, cost.calibration
        calibrated = None if calibration is None else calibration.held_after_running(0)
        if key in measured or calibrated is None:
            continue
        first = first_run_rise(
            operator, targets[name], kwargs, key, client, predicted_peak=_peak_of(cost)
        )
        if first is None:
            continue
        measured[key] = first
        above = first.rise > calibrated + ABSOLUTE_SLACK
        if above and not first.ran_before:
            with contextlib.suppress(CalibrationError):  # counted in this plan all the same
                if load_kept(key, cost.device) is None:
                    record_kept(key, cost.device, first.rise)
    return measured


def _peak_of(cost: TaskCost) -> Callable[[Mapping[str, int]], float]:
    """``cost``'s predicted peak of one task, in bytes, as a function of a block's extents."""

    def peak(extents: Mapping[str, int]) -> float:
        return float(cost.peak_bytes({d: np.asarray([extents[d]]) for d in cost.dims})[0])

    return peak


def without_loaded_runtime(budget: Budget, operator: Operator, problem: PlanProblem) -> PlanProblem:
    """``problem`` without the operator's runtime where the budget's baseline holds it.

    With no cluster, the budget's baseline is this process's memory now, and the tasks run
    here: compiled code loaded here already (:meth:`Operator.runtime_loaded`) is in that
    baseline. Counted again, a second GST3D plan in one process, after the first had run,
    needed 750 MB where the first had needed 530 MB.

    On a cluster of fixed workers that have all loaded it (a plan after a run), their memory,
    read into the baseline, holds it, and the tasks no longer count it. Where workers may join
    later (an adaptive cluster, a scheduler started elsewhere), it stays counted per task: a
    new worker loads it with its first task, which a run's report then measures as such.
    Counted in both, a second GST3D plan on 1 worker x 4 threads counted the kernel in the
    252 MiB the worker held after the first run and again as 32 MiB in each task.
    """
    runtime = max((layout.runtime_bytes for layout in problem.inputs), default=0.0)
    if not runtime:
        return problem
    if budget.baseline_is_this_process and operator.runtime_loaded():
        note = (
            f"{operator.name}'s compiled code is loaded in this process already: the memory it "
            f"holds counts it, and the plan does not count it again"
        )
    elif not _workers_may_join() and _loaded_in_every_worker(budget, operator):
        note = (
            f"{operator.name}'s compiled code ({budget.format(runtime)}) is loaded in every "
            f"worker already: the memory they hold counts it, and the tasks do not count it again"
        )
    else:
        return problem
    inputs = tuple(replace(layout, runtime_bytes=0.0) for layout in problem.inputs)
    return replace(problem, inputs=inputs, notes=(*problem.notes, note))


def _loaded_in_every_worker(budget: Budget, operator: Operator) -> bool:
    """Whether every worker of the cluster the budget was read from holds the runtime now.

    Each is asked within :data:`~xarray_memchunk.clusters.ASK_TIMEOUT`; one that does not
    answer, or an asynchronous client, counts as a worker without it.
    """
    if not budget.read_from_cluster or budget.device != "cpu":
        return False
    client = active_client()
    if client is None:
        return False
    try:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
    except Exception:  # the scheduler gone: count the runtime, as for a fresh worker
        return False
    loaded = ask_workers(client, operator.runtime_loaded, workers)
    if loaded is None:  # not asked: count the runtime, as for a fresh worker
        return False
    return bool(workers) and all(loaded.get(w) is True for w in workers)


def _workers_may_join() -> bool:
    """Whether the active client's cluster may start workers beyond those it has.

    An adaptive cluster may, and so may a scheduler this process did not start (a cluster
    manager elsewhere adds workers to it); a cluster with a fixed set of workers may not.
    """
    from ._dask_compat import adaptive_bounds

    client = active_client()
    cluster = getattr(client, "cluster", None)
    return cluster is None or adaptive_bounds(cluster) is not None

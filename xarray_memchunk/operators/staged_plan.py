"""Plan a staged rechunk: a graph's data read from a temporary Zarr store, in chunks chosen for it.

Where rechunking a Dask graph's data in memory cannot fit the budget, the plan is made for
reading it from a temporary store instead (:mod:`~xarray_memchunk.operators.staging` writes
it). :func:`plan_staged` plans once reading from a store in the source's chunks, then chooses
each variable's store chunks for that plan
(:func:`~xarray_memchunk.operators.staging.staging_chunks`: pieces of the source chunks no
larger than the planned ones, thin source chunks taken several per write task within the
budget, and along a thin first dim the planned length, written in slabs) and plans again for
reading from those (a read decodes whole store chunks); the store's chunks are chosen again
for that plan, until they stay (at most :data:`STAGING_ROUNDS` times).
Each plan is made for the store it reads from; where one finds nothing, the store chunks of the
last plan that did stand.

A file's data is staged the same way: where no plan fits reading it from its own storage chunks
(a read that cuts across them decodes them whole), and where a plan in memory would read each
storage chunk many times over (:mod:`~xarray_memchunk.operators.read_once`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..clusters import active_client
from ..errors import BudgetError, InfeasiblePlanError
from ..planning.budget import Budget, format_size, with_baseline
from ..planning.footprint import READ_COPIES, InputKind, source_blocks
from ..planning.plan import ChunkPlan
from ..planning.problem import DimSpec, PlanProblem
from ..planning.search import plan_chunks, plan_for_chunks
from .cost import TaskCost
from .staging import StagingChunks, StagingSite, slab_writes, staging_chunks, staging_site

__all__ = [
    "FILE_STAGING_WHY",
    "GRAPH_STAGING_WHY",
    "STAGING_ROUNDS",
    "STAGING_KEPT_POWER",
    "STAGING_KEPT_SCALE",
    "StagedPlan",
    "as_stored",
    "plan_staged",
    "staging_kept_bytes",
    "write_task_bytes",
]

#: Why a graph's data is staged, in the plan's note (where the caller names no other reason).
GRAPH_STAGING_WHY = "the data's chunks cannot be rechunked in memory within the budget"
#: Why a file's data is staged where no plan fits reading its own storage chunks.
FILE_STAGING_WHY = "no plan reading the file's own storage chunks fits the budget"
#: Times at most the staging store's chunks are chosen for the plan and the plan made again for
#: reading them (they settle in one or two).
STAGING_ROUNDS = 3
#: What a worker keeps after it ran a staging write, beyond its memory before it (after a
#: collection and a trim), is :data:`STAGING_KEPT_SCALE` x the source chunks it wrote to the
#: :data:`STAGING_KEPT_POWER`: the graph's tasks and small chunks leave Python's and the
#: allocator's pools larger, less than in proportion. Measured on 1 worker x 2 threads, a
#: 6449 x 57 x 114 float32 graph staged from chunks of 30, 4, 2 and 1 days (215 to 6449 tasks)
#: kept 5.4, 36, 50.5 and 89 MiB, and a 3000-day one in one-day chunks 47.4 MiB; on 2 workers,
#: one-day chunks (3225 each), 35 and 37 MiB. Counted: 10.3, 42, 66, 111 and 65 MiB, and 66.
STAGING_KEPT_SCALE = 0.24 * 2**20
#: See :data:`STAGING_KEPT_SCALE`.
STAGING_KEPT_POWER = 0.7


@dataclass(frozen=True)
class StagedPlan:
    """A plan that reads the graph variables from a temporary Zarr store.

    Attributes
    ----------
    plan
        The plan, made for reading from the store's chunks.
    variables
        The variables written to the store (those a Dask graph produces).
    site
        Where the store is written.
    chunks
        Variable name -> the chunks its store is written in.
    problem
        What ``plan`` was made from: reading the store.
    """

    plan: ChunkPlan
    variables: tuple[str, ...]
    site: StagingSite
    chunks: Mapping[str, StagingChunks]
    problem: PlanProblem


@dataclass(frozen=True)
class _Staging:
    """What every round of staged planning reads.

    Attributes
    ----------
    costs
        Every planned variable's cost.
    graphs
        The variables staged: those of ``costs`` that a Dask graph produces, or those read
        from a file that a plan would read many times over.
    problem
        The problem of planning in memory.
    budget
        The budget planned for.
    site
        Where the store is written.
    nbytes
        Bytes of the staged data.
    why
        Why the data is staged: the start of the plan's note.
    """

    costs: Mapping[str, TaskCost]
    graphs: Mapping[str, TaskCost]
    problem: PlanProblem
    budget: Budget
    site: StagingSite
    nbytes: int
    why: str


def plan_staged(
    costs: Mapping[str, TaskCost],
    problem: PlanProblem,
    budget: Budget,
    in_memory: InfeasiblePlanError,
    measure: str = "auto",
    *,
    variables: tuple[str, ...] | None = None,
    why: str = "",
) -> StagedPlan:
    """Plan with the graph variables staged on disk, where rechunking them in memory cannot fit.

    Or with the variables named (``variables``; ``why`` says why, for the plan's note): files
    whose storage chunks a plan in memory would read many times over
    (:mod:`~xarray_memchunk.operators.read_once`).

    Parameters
    ----------
    costs
        Every planned variable's cost (variable name -> :class:`TaskCost`).
    problem
        The problem of planning in memory.
    budget
        The budget planned for.
    in_memory
        Why no plan fits in memory: raised again where no variable is a graph's, and the start
        of every refusal.
    measure
        ``"never"``: the staging disk's speed is not measured.

    Returns
    -------
    StagedPlan
        The plan made for the store's chunks, the variables staged, where, and in what chunks.

    Raises
    ------
    InfeasiblePlanError
        ``in_memory``'s reason, and why staging cannot do it either (a write task over the
        budget, no room on disk, no shared directory, or no plan even reading from disk).
    """
    if variables is None:  # a file stored without chunks is read in bounded groups already
        graphs = {n: c for n, c in costs.items() if _stageable(c)}
        files = any(c.layout.kind is InputKind.FILE for c in graphs.values())
        why = why or (FILE_STAGING_WHY if files else GRAPH_STAGING_WHY)
    else:
        graphs = {n: costs[n] for n in variables}
    if not graphs:
        raise in_memory
    budget = _after_staging(budget, graphs, in_memory)
    as_source = {n: as_stored(c) for n, c in graphs.items()}
    writes = _largest_write(graphs, as_source)
    nbytes = sum(c.dtype.itemsize * int(np.prod(list(c.sizes.values()))) for c in graphs.values())
    # the disk's speed only ranks plans: not measured for a refusal
    site = _site(nbytes, "never" if writes > budget.per_task else measure, in_memory)
    staging = _Staging(costs, graphs, problem, budget, site, nbytes, why or GRAPH_STAGING_WHY)
    reading = _noted(staging, as_source, chosen=False)
    try:
        first = plan_chunks(reading, budget)
    except InfeasiblePlanError as on_disk:
        if writes > budget.per_task:  # the writes first: the reads' figures come after them
            raise _writes_refusal(writes, budget, in_memory, on_disk) from None
        limits = [e.minimum_memory_limit for e in (in_memory, on_disk) if e.minimum_memory_limit]
        same = str(on_disk) == str(in_memory)  # a reason of the operator's, not of the layout
        raise _refusal(
            in_memory,
            "Staged in a temporary Zarr store, it does not fit either, for the same reason."
            if same
            else f"Staged in a temporary Zarr store, it does not fit either: {on_disk}",
            min(limits) if limits else None,
        ) from None
    if writes > budget.per_task:
        raise _writes_refusal(writes, budget, in_memory)
    chunk_plan, chosen, reading = _settle(staging, as_source, first, reading)
    chunk_plan = replace(chunk_plan, storage_staged=True)
    return StagedPlan(chunk_plan, tuple(graphs), site, chosen, reading)


def staging_kept_bytes(graphs: Mapping[str, TaskCost], n_workers: int) -> int:
    """What a worker keeps after the staging write of ``graphs``, in bytes.

    :data:`STAGING_KEPT_SCALE` x the source chunks it writes
    (:func:`~xarray_memchunk.planning.footprint.source_blocks`) to the
    :data:`STAGING_KEPT_POWER`. A source's chunks are spread over the workers (as many as there
    are chunks, at most ``n_workers``). A trial's monthly climatology of a graph in one-day
    chunks (6449 of them), staged on 1 worker x 2 threads at 0.5 GB, started its reads with the
    worker 38 MiB above the plan's baseline, and paused it 3 times.
    """
    per_worker = 0.0
    for cost in graphs.values():
        chunks = source_blocks(cost.layout, cost.sizes)
        per_worker += chunks / max(1, min(n_workers, chunks))
    return int(STAGING_KEPT_SCALE * per_worker**STAGING_KEPT_POWER)


def _after_staging(
    budget: Budget, graphs: Mapping[str, TaskCost], in_memory: InfeasiblePlanError
) -> Budget:
    """``budget`` for workers that hold what the staging write of ``graphs`` leaves in them.

    Raises
    ------
    InfeasiblePlanError
        ``in_memory``'s refusal, where that leaves no room for a task: its minimum the least
        of the two ways (room for a task after staging, which
        :func:`~xarray_memchunk.refusals.checked_minimum` plans before stating it).
    """
    kept = staging_kept_bytes(graphs, budget.n_workers)
    source = (
        f"{format_size(kept)} more after staging the data: what writing its source chunks "
        f"leaves in a worker"
    )
    try:
        return with_baseline(budget, budget.worker_baseline + kept, source)
    except BudgetError as exc:  # the least either way; planning checks it before stating it
        limits = [e.minimum_memory_limit for e in (in_memory, exc) if e.minimum_memory_limit]
        why = f"Staged in a temporary Zarr store, it does not fit either: {exc}"
        raise _refusal(in_memory, why, min(limits) if limits else None) from None


def _stageable(cost: TaskCost) -> bool:
    """Whether staging can help: a graph's data, or a file's stored in chunks."""
    layout = cost.layout
    return layout.kind is InputKind.GRAPH or (
        layout.kind is InputKind.FILE and not layout.reads_own_range
    )


def as_stored(cost: TaskCost) -> StagingChunks:
    """The variable staged in its source's chunks, as they come."""
    return StagingChunks(*(dict(cost.layout.source_chunks),) * 3)


def write_task_bytes(cost: TaskCost, chunks: StagingChunks) -> float:
    """Bytes a task writing one chunk of ``chunks`` holds, producing its source chunks included.

    A file's source chunk is decoded whole (:data:`READ_COPIES` x one) before the write starts,
    beside the source chunks the write merges that are already read; the task's peak is the
    larger phase (measured: staging a Zarr file of 127 MiB chunks, unmerged, peaked 2.8 x a
    chunk above the idle worker, where the two phases summed would be 6 x).

    Parameters
    ----------
    cost
        The variable's cost.
    chunks
        How it is staged.

    Returns
    -------
    float
    """
    writing = chunks.task_bytes(cost.dtype.itemsize) + cost.layout.produce_bytes
    if cost.layout.kind is not InputKind.FILE:
        return writing
    source = cost.dtype.itemsize * math.prod(chunks.source.values())
    reading = READ_COPIES * source + chunks.write_bytes(cost.dtype.itemsize) - source
    return max(writing, reading)


def _largest_write(graphs: Mapping[str, TaskCost], as_source: Mapping[str, StagingChunks]) -> float:
    """Bytes the largest task writing one source chunk as it is holds (the least staging needs)."""
    return max(write_task_bytes(c, as_source[n]) for n, c in graphs.items())


def _writes_refusal(
    writes: float,
    budget: Budget,
    in_memory: InfeasiblePlanError,
    on_disk: InfeasiblePlanError | None = None,
) -> InfeasiblePlanError:
    """The refusal where writing one source chunk as it is cannot fit the per-task budget.

    It states the least ``memory_limit`` that fits either way: in memory, or staged, where the
    writes fit and (``on_disk``, the refusal of reading the staged data at this budget) the
    reads do too. A new user's median of six yearly netCDF files on 1 GB workers was refused
    with 2.20 GiB, the in-memory route's figure, where staging ran from 1.31 GB.

    Parameters
    ----------
    writes
        Bytes of the largest write task (:func:`_largest_write`).
    budget
        The budget planned for.
    in_memory
        Why no plan fits in memory (the start of the refusal).
    on_disk
        Why reading the staged data does not fit this budget either; None where it does.

    Returns
    -------
    InfeasiblePlanError
    """
    size = budget.format
    staged = budget.minimum_memory_limit(writes)
    if staged is not None and on_disk is not None:
        staged = max(staged, on_disk.minimum_memory_limit) if on_disk.minimum_memory_limit else None
    in_memory_limit = in_memory.minimum_memory_limit
    limits = [m for m in (in_memory_limit, staged) if m]
    advice = "give the data smaller chunks first (.chunk(...))"
    if staged is not None and (in_memory_limit is None or staged < in_memory_limit):
        advice += f", or {budget.memory_limit_advice(staged)}, where it is staged"
    return _refusal(
        in_memory,
        f"Nor can it be staged in a temporary Zarr store: writing one of the data's chunks needs "
        f"{size(writes)}, over the per-task budget of {size(budget.per_task)}: {advice}",
        min(limits) if limits else None,
    )


def _refusal(
    in_memory: InfeasiblePlanError, why: str, minimum: int | None = None
) -> InfeasiblePlanError:
    """``in_memory``'s refusal, then ``why`` staging cannot do it either.

    ``minimum``: the least ``memory_limit`` either way, where it differs from ``in_memory``'s.
    The first's advice says it is for the data unstaged: each way states its own figure.
    """
    unstaged = str(in_memory).rstrip(".").replace(". To run it, ", ". To run it unstaged, ", 1)
    return InfeasiblePlanError(
        f"{unstaged}. {why}",
        minimum_memory_limit=minimum if minimum is not None else in_memory.minimum_memory_limit,
    )


def _site(nbytes: int, measure: str, in_memory: InfeasiblePlanError) -> StagingSite:
    """Where ``nbytes`` of staged data go (its disk measured unless ``measure="never"``).

    Parameters
    ----------
    nbytes
        Bytes of the staged data.
    measure
        ``"never"``: the disk's speed is not measured.
    in_memory
        Why no plan fits in memory (the start of the refusal).

    Returns
    -------
    StagingSite

    Raises
    ------
    InfeasiblePlanError
        When the data cannot be staged there (no room, no shared directory, not writable).
    """
    site = staging_site(nbytes, active_client(), measure_bandwidth=measure != "never")
    if site.refusal:
        why = f"Nor can it be staged in a temporary Zarr store: {site.refusal}"
        raise _refusal(in_memory, why) from None
    return site


def _reading(
    staging: _Staging, stores: Mapping[str, Mapping[str, int]], note: str = ""
) -> PlanProblem:
    """The problem of reading the graph variables from stores of the given chunks.

    Parameters
    ----------
    staging
        What staged planning reads.
    stores
        Variable name -> its store's chunk length per dim (every staged variable).
    note
        A note added to the problem's, where not empty.

    Returns
    -------
    PlanProblem
    """
    problem = staging.problem
    # the problem's layouts, not the costs': planning adjusted them (a runtime loaded already)
    layouts = {layout.name: layout for layout in problem.inputs}
    inputs = tuple(
        replace(
            layouts[c.layout.name],
            kind=InputKind.FILE,
            source_chunks=stores[n],
            raw_reads=slab_writes(c.dtype),  # written and read chunk file by chunk file
        )
        if n in staging.graphs
        else layouts[c.layout.name]
        for n, c in staging.costs.items()
    )
    return replace(problem, inputs=inputs, notes=(*problem.notes, *([note] if note else [])))


def _staging_note(staging: _Staging, chunks: Mapping[str, StagingChunks], chosen: bool) -> str:
    """The plan's note on staging: where the data is written, in what chunks, and its cost.

    Parameters
    ----------
    staging
        What staged planning reads.
    chunks
        How each variable is staged.
    chosen
        Whether ``chunks`` were chosen for a plan (else they are the source's).

    Returns
    -------
    str
    """
    graphs, site, nbytes, size = staging.graphs, staging.site, staging.nbytes, staging.budget.format
    written = [
        f"{n + ' ' if len(graphs) > 1 else ''}"
        + (chunks[n].describe() if chosen else "in the source's chunks")
        for n in graphs
    ]
    held = max(write_task_bytes(c, chunks[n]) for n, c in graphs.items())
    return (
        f"{staging.why}, so apply first writes {', '.join(graphs)} to a temporary Zarr store "
        f"in {site.where} "
        f"({size(nbytes)}; {'; '.join(written)}; each write task holds up to "
        f"{size(held)}; {site.speed(nbytes)}), and each task reads its block from it"
    )


def _noted(staging: _Staging, chunks: Mapping[str, StagingChunks], chosen: bool) -> PlanProblem:
    """:func:`_reading` the stores of ``chunks``, noting how the data is written.

    Parameters
    ----------
    staging
        What staged planning reads.
    chunks
        How each variable is staged.
    chosen
        Whether ``chunks`` were chosen for a plan: the dims then align with the stores' chunks
        (:func:`_aligned_dims`).

    Returns
    -------
    PlanProblem
    """
    note = _staging_note(staging, chunks, chosen)
    stored = _reading(staging, {n: s.store for n, s in chunks.items()}, note)
    if not chosen:
        return stored
    return replace(stored, dims=_aligned_dims(staging, chunks))


def _aligned_dims(staging: _Staging, chunks: Mapping[str, StagingChunks]) -> tuple[DimSpec, ...]:
    """The problem's dims, with the store's chunks as storage chunks where no file has the dim.

    Parameters
    ----------
    staging
        What staged planning reads.
    chunks
        How each variable is staged (the first variable's store chunks win for a shared dim).

    Returns
    -------
    tuple of DimSpec
    """
    files = [
        c
        for n, c in staging.costs.items()
        if n not in staging.graphs and c.layout.kind is InputKind.FILE
    ]
    own = {d: s.store[d] for s in reversed(list(chunks.values())) for d in s.store}
    return tuple(
        replace(d, storage_chunk=own[d.name])
        if d.name in own and not any(d.name in c.dims for c in files)
        else d
        for d in staging.problem.dims
    )


def _reads_fit(
    staging: _Staging,
    name: str,
    planned: ChunkPlan,
    current: Mapping[str, StagingChunks],
    store: Mapping[str, int],
) -> bool:
    """Whether the blocks of ``planned`` fit, ``name`` read from ``store``.

    Parameters
    ----------
    staging
        What staged planning reads.
    name
        The variable whose store chunks are tried.
    planned
        The plan whose blocks are read.
    current
        How each variable is staged now (the others are read from these).
    store
        The store chunks tried for ``name``.

    Returns
    -------
    bool
    """
    stores = {n: s.store for n, s in current.items()} | {name: store}
    return plan_for_chunks(_reading(staging, stores), staging.budget, planned.dask_chunks).fits


def _store_chunks(
    staging: _Staging, chunk_plan: ChunkPlan, current: Mapping[str, StagingChunks]
) -> dict[str, StagingChunks]:
    """Each staged variable's store and write chunks, chosen for ``chunk_plan``.

    Parameters
    ----------
    staging
        What staged planning reads.
    chunk_plan
        The plan the store's chunks are chosen for.
    current
        How each variable is staged for ``chunk_plan``.

    Returns
    -------
    dict of str to StagingChunks
    """
    budget = staging.budget
    return {
        n: staging_chunks(
            c.layout.source_chunks,
            chunk_plan.chunks,
            c.dtype.itemsize,
            budget.per_task - c.layout.produce_bytes,
            functools.partial(_reads_fit, staging, n, chunk_plan, current),
            c.sizes,
            slabs=slab_writes(c.dtype),
        )
        for n, c in staging.graphs.items()
    }


def _settle(
    staging: _Staging,
    as_source: dict[str, StagingChunks],
    first: ChunkPlan,
    reading: PlanProblem,
) -> tuple[ChunkPlan, dict[str, StagingChunks], PlanProblem]:
    """Choose the store's chunks for the plan and plan again for them, until they stay.

    A plan made for reading the store may cut the data otherwise: its store chunks are chosen
    in turn, at most :data:`STAGING_ROUNDS` times (each plan is made for the store it reads
    from).

    Parameters
    ----------
    staging
        What staged planning reads.
    as_source
        Each variable stored in its source's chunks.
    first
        The plan for reading ``as_source``.
    reading
        The problem ``first`` was made from.

    Returns
    -------
    tuple of ChunkPlan, dict of str to StagingChunks, and PlanProblem
        The last plan found, the store chunks it was made for, and its problem.
    """
    chosen, chunk_plan = as_source, first
    for _ in range(STAGING_ROUNDS):
        again = _store_chunks(staging, chunk_plan, chosen)
        if again == chosen:
            break
        problem = _noted(staging, again, chosen=True)
        try:
            chunk_plan = plan_chunks(problem, staging.budget)
        except InfeasiblePlanError:  # not expected: the last plan's chunks fit reading it
            break
        chosen, reading = again, problem
    return chunk_plan, chosen, reading

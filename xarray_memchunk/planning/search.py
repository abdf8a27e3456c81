"""Choose chunks: the fastest balanced chunking whose predicted peak per task fits the budget.

All candidates (a few per dim, combined across dims) are scored at once with numpy:

- memory: ``problem.peak_bytes(padded task extents) <= budget.per_task`` (a hard constraint);
- estimated time: ``(waves + PIPELINE_TAIL) * (task_overhead_s + seconds_per_element * padded
  elements per task + read_seconds_per_element * storage elements read per task)`` with
  ``waves = ceil(n_tasks / total_threads)``. This one number rewards parallelism (more waves
  cost more), penalises tiny chunks (per-task overhead), halo (padded elements are computed
  twice) and chunks that cut across storage chunks (those are read by several tasks). The
  ``PIPELINE_TAIL`` of one task duration stands for filling and draining the pipeline: the
  first task waits for its input, the last task's output is sent after it ends, and threads
  that finish early idle. It makes a few tasks per thread beat exactly one huge task per
  thread, as measured (``benchmarks/gst3d_experiment.py``);
- storage alignment: a plan made of whole storage chunks is preferred when its estimated time is
  within ``ALIGNMENT_TOLERANCE`` of the fastest plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..budget import Budget
from ..errors import InfeasiblePlanError
from ..units import format_bytes
from .balance import balanced_chunks
from .candidates import DimCandidates, dim_candidates, padded_extent
from .plan import Binding, ChunkPlan
from .problem import DimRole, PlanProblem

__all__ = [
    "ALIGNMENT_TOLERANCE",
    "MAX_COMBINATIONS",
    "PIPELINE_TAIL",
    "plan_chunks",
    "plan_for_chunks",
]

#: Upper bound on the candidate chunk shapes scored at once (keeps planning in milliseconds).
MAX_COMBINATIONS = 200_000
#: A storage-aligned plan is taken when it is at most this much slower than the fastest one.
ALIGNMENT_TOLERANCE = 0.10
#: Task durations added to the waves for filling and draining the pipeline.
PIPELINE_TAIL = 1.0
#: Plans whose estimated times differ by less than this are tied; ties go to fewer tasks.
TIME_RESOLUTION = 0.01


def _keep_per_dim(problem: PlanProblem) -> int:
    splittable = sum(1 for d in problem.dims if d.role is not DimRole.WHOLE and d.size > 1)
    if splittable == 0:
        return 1
    return max(4, int(MAX_COMBINATIONS ** (1 / splittable) / 2))


def _estimated_seconds(
    problem: PlanProblem, n_tasks, padded_elements, touched_elements, total_threads: int
):
    waves = np.ceil(n_tasks / max(1, total_threads)) + PIPELINE_TAIL
    per_task = (
        problem.task_overhead_s
        + problem.seconds_per_element * padded_elements
        + problem.read_seconds_per_element * touched_elements
    )
    return waves * per_task


def _grid(problem: PlanProblem) -> tuple[list[DimCandidates], np.ndarray]:
    keep = _keep_per_dim(problem)
    per_dim = [dim_candidates(dim, keep) for dim in problem.dims]
    index = np.indices([len(c) for c in per_dim]).reshape(len(per_dim), -1)
    return per_dim, index


def _min_worker_memory(peak: int, budget: Budget) -> int:
    """Worker memory limit at which a task of ``peak`` bytes would fit (inverse budget formula)."""
    usable = peak * budget.threads_per_worker / budget.task_share + budget.worker_baseline
    return math.ceil(usable / budget.pause_fraction)


def _infeasible(problem: PlanProblem, budget: Budget, min_peak: int, smallest: dict) -> str:
    whole = [d.name for d in problem.dims if d.role is DimRole.WHOLE]
    chunks = ", ".join(f"{k}: {v}" for k, v in smallest.items())
    advice = [
        f"give each worker at least {format_bytes(_min_worker_memory(min_peak, budget))} "
        f"(memory_limit) at {budget.threads_per_worker} thread(s) per worker",
        "or run fewer threads per worker (each thread runs a task at once)",
    ]
    if whole:
        advice.append(
            f"or select a shorter range of {', '.join(whole)} (the operator needs "
            f"{'it' if len(whole) == 1 else 'them'} in one chunk)"
        )
    return (
        f"{problem.operator!r} cannot fit one task in the per-task budget of "
        f"{format_bytes(budget.per_task)}: even the smallest chunks it allows ({chunks}) are "
        f"predicted to peak at {format_bytes(min_peak)} per task. To run it, "
        + "; ".join(advice)
        + f". Budget: {budget.explain()}."
    )


def plan_chunks(problem: PlanProblem, budget: Budget) -> ChunkPlan:
    """Choose balanced chunks whose predicted peak per task fits ``budget.per_task``.

    Parameters
    ----------
    problem
        The dims, their roles and storage chunks, and the operator's task memory function.
    budget
        Per-task memory budget and thread count.

    Returns
    -------
    ChunkPlan

    Raises
    ------
    InfeasiblePlanError
        When no allowed chunking fits; the message states the minimum memory needed.
    """
    per_dim, index = _grid(problem)
    names = [d.name for d in problem.dims]
    padded = {n: c.padded[i] for n, c, i in zip(names, per_dim, index, strict=True)}
    n_chunks = np.prod([c.n_chunks[i] for c, i in zip(per_dim, index, strict=True)], axis=0)
    elements = np.prod([padded[n] for n in names], axis=0, dtype=np.float64)
    peak = np.asarray(problem.peak_bytes(padded), dtype=np.float64)
    peak = np.broadcast_to(peak, elements.shape)
    touched = np.prod(
        [c.touched[i] for c, i in zip(per_dim, index, strict=True)], axis=0, dtype=np.float64
    )
    seconds = _estimated_seconds(problem, n_chunks, elements, touched, budget.total_threads)
    # near-ties in time (within TIME_RESOLUTION) go to fewer tasks, then to the smaller peak
    tied_seconds = np.round(np.log(seconds) / np.log1p(TIME_RESOLUTION))
    order = np.lexsort((peak, n_chunks, tied_seconds))
    fits = peak <= budget.per_task
    if not fits.any():
        smallest = int(np.argmin(peak))
        shape = {
            n: int(c.lengths[i[smallest]]) for n, c, i in zip(names, per_dim, index, strict=True)
        }
        raise InfeasiblePlanError(_infeasible(problem, budget, int(peak[smallest]), shape))
    ranked = order[fits[order]]
    fastest = int(ranked[0])
    aligned = np.all([c.aligned[i] for c, i in zip(per_dim, index, strict=True)], axis=0)
    chosen, notes = fastest, list(problem.notes)
    binding = Binding.PARALLELISM if n_chunks[fastest] > 1 else Binding.TASK_OVERHEAD
    if not fits[int(order[0])]:
        binding = Binding.MEMORY
    if not aligned[fastest]:
        aligned_fits = ranked[aligned[ranked]]
        limit = seconds[fastest] * (1 + ALIGNMENT_TOLERANCE)
        if len(aligned_fits) and seconds[aligned_fits[0]] <= limit:
            chosen, binding = int(aligned_fits[0]), Binding.STORAGE_ALIGNMENT
        elif len(aligned_fits):
            extra = seconds[aligned_fits[0]] / seconds[fastest] - 1
            notes.append(
                f"storage alignment given up: the fastest aligned plan is estimated "
                f"{100 * extra:.0f}% slower (more than {100 * ALIGNMENT_TOLERANCE:.0f}%)"
            )
        else:
            notes.append(
                "storage alignment given up: no plan of whole storage chunks fits the budget"
            )
    pick = {n: (c, int(i[chosen])) for n, c, i in zip(names, per_dim, index, strict=True)}
    dask_chunks = {
        n: balanced_chunks(d.size, int(c.n_chunks[k]), int(c.units[k]))
        for d, (n, (c, k)) in zip(problem.dims, pick.items(), strict=True)
    }
    return _make_plan(
        problem,
        budget,
        dask_chunks,
        int(peak[chosen]),
        binding,
        float(seconds[chosen]),
        notes,
        aligned=bool(aligned[chosen]),
    )


def _make_plan(
    problem: PlanProblem,
    budget: Budget,
    dask_chunks: Mapping[str, tuple[int, ...]],
    peak: int,
    binding: str,
    seconds: float,
    notes: list[str],
    *,
    aligned: bool,
) -> ChunkPlan:
    return ChunkPlan(
        operator=problem.operator,
        dims=tuple(d.name for d in problem.dims),
        chunks={n: max(c) for n, c in dask_chunks.items()},
        dask_chunks=dict(dask_chunks),
        predicted_peak_bytes=peak,
        budget=budget,
        n_tasks=int(np.prod([len(c) for c in dask_chunks.values()])),
        binding=binding,
        halo={d.name: d.depth for d in problem.dims if d.role is DimRole.HALO and d.depth},
        whole_dims=tuple(d.name for d in problem.dims if d.role is DimRole.WHOLE),
        storage_chunks={d.name: d.storage_chunk for d in problem.dims},
        storage_aligned=aligned,
        estimated_seconds=seconds,
        notes=tuple(notes),
    )


def plan_for_chunks(
    problem: PlanProblem, budget: Budget, dask_chunks: Mapping[str, tuple[int, ...]]
) -> ChunkPlan:
    """Build the plan (prediction, task count) for chunks the user chose.

    Parameters
    ----------
    problem
        As for :func:`plan_chunks`.
    budget
        Per-task memory budget; a plan that exceeds it is returned all the same (the caller
        warns), with ``fits`` False.
    dask_chunks
        Chunk lengths per dim, for every dim of ``problem``.
    """
    padded, lengths, counts = {}, {}, []
    for d in problem.dims:
        chunks = tuple(int(c) for c in dask_chunks[d.name])
        depth = d.depth if d.role is DimRole.HALO else 0
        lengths[d.name] = max(chunks)
        padded[d.name] = np.array([padded_extent(max(chunks), len(chunks), depth)])
        counts.append(len(chunks))
    peak = int(np.asarray(problem.peak_bytes(padded)).reshape(-1)[0])
    elements = float(np.prod([p[0] for p in padded.values()], dtype=np.float64))
    n_tasks = int(np.prod(counts))
    seconds = float(_estimated_seconds(problem, n_tasks, elements, elements, budget.total_threads))
    aligned = all(
        not d.storage_chunk or all(c % d.storage_chunk == 0 for c in dask_chunks[d.name][:-1])
        for d in problem.dims
    )
    return _make_plan(
        problem,
        budget,
        {d.name: tuple(dask_chunks[d.name]) for d in problem.dims},
        peak,
        Binding.USER_CHUNKS,
        seconds,
        list(problem.notes),
        aligned=aligned,
    )

"""Choose chunks: the fastest count of chunks per dim whose predicted peak fits the budget.

All candidates (a few per dim, combined across dims) are scored at once with numpy:

- memory: the task slot's footprint (the operator's task from ``problem.peak_bytes`` of the
  padded task extents, plus its assembled input and the chunks a worker holds for it, see
  :mod:`~xarray_memchunk.planning.footprint`) ``<= budget.per_task`` (a hard constraint);
- estimated time: ``(waves + PIPELINE_TAIL) * (task_overhead_s + seconds_per_element * padded
  elements per task (each variable's, over its own dims) + read_seconds_per_element * storage
  elements read per task) +
  combine_seconds_per_chunk * n_tasks`` (the serial steps that combine the tasks' results) with
  ``waves = ceil(n_tasks / compute_slots)`` (the budget's threads, at most the cores they
  share on this machine; one per GPU, which runs one task's kernels at a time, and no tail:
  see :func:`_waves`). This one number rewards parallelism (more waves cost more), penalises
  tiny chunks (per-task overhead), halo (padded elements are computed twice) and chunks that
  cut across storage chunks (those are read by several tasks). The
  ``PIPELINE_TAIL`` of one task duration stands for filling and draining the pipeline: the
  first task waits for its input, the last task's output is sent after it ends, and threads
  that finish early idle. It makes a few tasks per thread beat exactly one huge task per
  thread, as measured (``benchmarks/gst3d_experiment.py``);
- storage alignment: a plan made of whole storage chunks is preferred when its estimated time is
  within ``ALIGNMENT_TOLERANCE`` of the fastest plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from ..errors import InfeasiblePlanError
from .balance import balanced_chunks, packed_chunks
from .budget import IN_PROCESS_BASELINE, Budget, held_memory_remedy
from .candidates import DimCandidates, dim_candidates, padded_extent
from .footprint import DimCut, Footprint, footprint
from .plan import Binding, ChunkPlan
from .problem import DimRole, DimSpec, PlanProblem

__all__ = [
    "ALIGNMENT_TOLERANCE",
    "MAX_COMBINATIONS",
    "PIPELINE_TAIL",
    "operator_peak_within",
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


def _waves(n_tasks: np.ndarray | int, budget: Budget) -> np.ndarray:
    """Task durations a plan of ``n_tasks`` takes, the pipeline's fill and drain included.

    The waves of ``compute_slots`` tasks, and on CPUs ``PIPELINE_TAIL`` more. A GPU computes
    one task at a time however many threads feed it, so its tasks run back to back, with no
    tail: a tail would make more, smaller tasks look cheaper, where on the device they only
    add halo and overhead (a 400^3 volume in 8 tasks of up to 256^3 took 0.069 s, in one task
    0.041 s, on an H100: ``benchmarks/results/gpu_gst3d.md``).
    """
    waves = np.ceil(np.asarray(n_tasks, dtype=np.float64) / max(1, budget.compute_slots))
    return waves if budget.device == "gpu" else waves + PIPELINE_TAIL


def _estimated_seconds(
    problem: PlanProblem,
    n_tasks,
    cuts: Mapping[str, DimCut],
    touched_elements,
    budget: Budget,
):
    waves = _waves(n_tasks, budget)
    if problem.work_terms:  # each variable's work over its own dims
        work = sum(seconds * _padded_over(cuts, dims) for dims, seconds in problem.work_terms)
    else:
        work = problem.seconds_per_element * _padded_over(cuts, cuts)
    per_task = problem.task_overhead_s + work + problem.read_seconds_per_element * touched_elements
    return waves * per_task + problem.combine_seconds_per_chunk * np.asarray(n_tasks)


def _grid(problem: PlanProblem) -> tuple[list[DimCandidates], np.ndarray]:
    keep = _keep_per_dim(problem)
    per_dim = [dim_candidates(dim, keep) for dim in problem.dims]
    index = np.indices([len(c) for c in per_dim]).reshape(len(per_dim), -1)
    return per_dim, index


def _footprint(
    problem: PlanProblem,
    budget: Budget,
    cuts: Mapping[str, DimCut],
    task: np.ndarray | None = None,
) -> Footprint:
    """The slot's terms per candidate; ``task``: the operator's peak, else its model's."""
    if task is None:
        padded = {name: cut.padded for name, cut in cuts.items()}
        task = np.asarray(problem.peak_bytes(padded), dtype=np.float64)
        task = np.broadcast_to(task, next(iter(padded.values())).shape)
    return footprint(
        task,
        cuts,
        problem.inputs,
        threads_per_worker=budget.threads_per_worker,
        n_workers=budget.n_workers,
        device=budget.device,
    )


def _infeasible(
    problem: PlanProblem,
    budget: Budget,
    least: dict[str, float],
    smallest: dict[str, int],
    needed: int | None,
) -> str:
    whole = [d.name for d in problem.dims if d.role is DimRole.WHOLE]
    chunks = ", ".join(f"{k}: {v}" for k, v in smallest.items())
    size = budget.format
    total = sum(least.values())
    holder = "this process" if budget.threaded_scheduler else "a worker"
    terms = f"the task {size(least['task'])}"
    if least["gather"]:
        terms += f" + gathering its input {size(least['gather'])}"
    if least["held"]:
        terms += f" + chunks {holder} holds for it {size(least['held'])}"
    if least["factors"]:
        terms += f" + factors the operator holds {size(least['factors'])}"
    if least["produce"]:
        terms += f" + producing its input {size(least['produce'])}"
    if least["graph"]:
        terms += f" + Dask's record of the graph's tasks {size(least['graph'])}"
    if least["runtime"]:
        terms += f" + compiled code {holder} keeps {size(least['runtime'])}"
    advice = []
    if least["held"] > least["task"]:
        sources = "; ".join(
            f"{v.name} in chunks of "
            + ", ".join(f"{d}: {v.source_chunks[d]}" for d in v.dims if d in v.source_chunks)
            for v in problem.inputs
        )
        advice.append(
            f"most of it is input chunks held in {holder}'s memory while the graph rechunks or "
            f"overlaps them ({sources}): plan on the data as opened from Zarr or netCDF "
            f"(xarray.open_dataset or open_mfdataset with chunks={{}}, no operation in "
            f"between), and memchunk reads each task's block straight from the files; or write "
            f"the prepared data to Zarr first, or rechunk it on disk (rechunker)"
        )
    if needed is not None:
        # the workers of this process are planned as one worker of all their threads
        here = budget.in_this_process
        if budget.threaded_scheduler:
            fewer = "or compute with fewer threads (the dask config key num_workers)"
        elif here:
            fewer = "or run fewer threads in all (workers x threads per worker)"
        else:
            fewer = "or run fewer threads per worker (each thread runs a task at once)"
        advice += [budget.memory_limit_advice(needed), fewer]
        if here and not budget.baseline_source.startswith(IN_PROCESS_BASELINE):  # else: remedy
            advice.append(
                "or start the workers in processes of their own (processes=True): each then "
                "pauses on its own memory"
            )
    else:  # a per-task budget given by hand: neither memory_limit nor threads decide it
        advice.append(f"give each task at least {budget.format_minimum(total)} (Budget.per_task)")
    remedy = held_memory_remedy(budget.worker_baseline, budget.baseline_source)
    if remedy:
        advice.append(remedy)
    advice += [f"or {remedy}" for remedy in budget.baseline_remedies]
    if whole:
        advice.append(
            f"or select a shorter range of {', '.join(whole)} (the operator needs "
            f"{'it' if len(whole) == 1 else 'them'} in one chunk)"
        )
    return (
        f"{problem.operator!r} cannot fit one task in the per-task budget of "
        f"{size(budget.per_task)}: even the chunks it allows that need least ({chunks}) are "
        f"predicted to need {size(total)} per task ({terms}). To run it, "
        + "; ".join(advice)
        + f". Budget: {budget.explain()}."
    )


def _over_the_cap(
    problem: PlanProblem,
    budget: Budget,
    cuts: Mapping[str, DimCut],
    terms: Footprint,
    n_chunks: np.ndarray,
    allowed: np.ndarray,
    in_range: np.ndarray,
) -> InfeasiblePlanError:
    """The refusal where only chunkings of more than ``problem.max_chunks`` chunks fit.

    It states the memory at which the allowed chunking of the least peak fits, where one is
    allowed (within the cap and the measured range).
    """
    variables = len(problem.inputs)
    shared = (
        f" ({problem.max_tasks:,} tasks shared by its {variables} variables, a task per chunk "
        f"of each)"
        if variables > 1
        else ""
    )
    over = (
        f"{problem.operator!r}: every chunking that fits the per-task budget of "
        f"{budget.format(budget.per_task)} has more than {problem.max_chunks:,} chunks (at "
        f"least {int(n_chunks[in_range].min()):,}), the most a plan may have{shared}: a graph "
        "that large takes minutes to build and schedule, and memory in the client"
    )
    raise_cap = "raise the dask config key memchunk.max-tasks to plan one anyway"
    if not allowed.any():  # none within the cap is within the model's measured range
        return InfeasiblePlanError(
            f"{over}; and every chunking of at most {problem.max_chunks:,} chunks has tasks "
            f"larger than its memory model was measured on ({_measured_range(problem)}). To "
            f"run it, {raise_cap}, or calibrate it on larger blocks (xarray_memchunk.calibrate "
            f"with shapes=...)"
        )
    peak = terms.total
    smallest = int(np.argmin(np.where(allowed, peak, np.inf)))
    shape = ", ".join(f"{n}: {int(cut.lengths[smallest])}" for n, cut in cuts.items())
    needed = budget.minimum_memory_limit(float(peak[smallest]))
    advice = [raise_cap]
    if needed is not None:
        advice.insert(0, budget.memory_limit_advice(needed))
    return InfeasiblePlanError(
        f"{over}. Within that, the chunks that need least ({shape}) need "
        f"{budget.format(float(peak[smallest]))} per task. To run it, {'; or '.join(advice)}. "
        f"Budget: {budget.explain()}.",
        minimum_memory_limit=needed,
    )


def _measured_range(problem: PlanProblem) -> str:
    """The measured range a plan must stay within, in words."""
    parts = []
    if problem.max_task_elements:
        parts.append(f"{problem.max_task_elements:,.0f} elements")
    parts += [f"{cap:,.0f} elements over {', '.join(d)}" for d, cap in problem.task_element_caps]
    parts += [f"{name} <= {cap:,.0f}" for name, cap in problem.max_extents.items()]
    return ", ".join(parts)


def plan_chunks(problem: PlanProblem, budget: Budget) -> ChunkPlan:
    """Choose chunks whose predicted peak per task fits ``budget.per_task``.

    Candidates are counts of balanced chunks per dim; the chosen count is laid out as Zarr's
    regular chunks where that keeps it (:func:`_chunks_of`).

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
    cuts = {d.name: _cut(d, c, i) for d, c, i in zip(problem.dims, per_dim, index, strict=True)}
    n_chunks = np.prod([cut.n_chunks for cut in cuts.values()], axis=0)
    terms = _footprint(problem, budget, cuts)
    peak = terms.total
    touched = np.prod(
        [c.touched[i] for c, i in zip(per_dim, index, strict=True)], axis=0, dtype=np.float64
    )
    seconds = _estimated_seconds(problem, n_chunks, cuts, touched, budget)
    # near-ties in time (within TIME_RESOLUTION) go to fewer tasks, then to the smaller peak
    tied_seconds = np.round(np.log(seconds) / np.log1p(TIME_RESOLUTION))
    order = np.lexsort((peak, n_chunks, tied_seconds))
    fits = peak <= budget.per_task
    measured = np.ones_like(fits)
    for _, counted, cap in _range_limits(problem, cuts):
        measured = measured & (counted <= cap)
    in_range = fits & measured
    if not measured.any() or (fits.any() and not in_range.any()):
        which = "it allows" if not measured.any() else "that fits the budget"
        raise InfeasiblePlanError(
            f"{problem.operator!r}: every chunking {which} has tasks larger than its memory "
            f"model was measured on ({_measured_range(problem)}); calibrate it on larger "
            f"blocks (xarray_memchunk.calibrate with shapes=...)"
        )
    few_enough = n_chunks <= problem.max_chunks
    allowed = measured & few_enough
    if in_range.any() and not (in_range & few_enough).any():
        raise _over_the_cap(problem, budget, cuts, terms, n_chunks, allowed, in_range)
    fits = in_range & few_enough
    if not fits.any():
        # the least an allowed chunking needs (within the measured range and the cap): the
        # minimum a refusal states is one at which the plan it names is allowed
        smallest = int(np.argmin(np.where(allowed if allowed.any() else measured, peak, np.inf)))
        shape = {n: int(cut.lengths[smallest]) for n, cut in cuts.items()}
        least = {k: float(getattr(terms, k)[smallest]) for k in Footprint.TERMS}
        needed = budget.minimum_memory_limit(sum(least.values()))
        raise InfeasiblePlanError(
            _infeasible(problem, budget, least, shape, needed),
            minimum_memory_limit=needed,
        )
    ranked = order[fits[order]]
    fastest = int(ranked[0])
    aligned = np.all([c.aligned[i] for c, i in zip(per_dim, index, strict=True)], axis=0)
    chosen, notes = fastest, list(problem.notes)

    def excluded_by(rejected: np.ndarray) -> str:
        """What kept out chunkings that did not fit: the cap, the range, else the budget."""
        if in_range[rejected].any():  # within budget and range: only the cap kept it out
            return Binding.MAX_TASKS
        in_budget = (peak[rejected] <= budget.per_task).any()
        return Binding.MODEL_RANGE if in_budget else Binding.MEMORY

    binding = Binding.PARALLELISM if n_chunks[fastest] > 1 else Binding.TASK_OVERHEAD
    if n_chunks.max() == 1:  # nothing was chosen: the operator allows one chunk only
        binding = Binding.WHOLE_DIMS
    faster = order[: int(np.flatnonzero(order == fastest)[0])]  # ranked ahead, none fits
    fewer = n_chunks < n_chunks[fastest]
    if len(faster):  # faster chunkings were kept out
        binding = excluded_by(faster)
    elif binding == Binding.PARALLELISM and fewer.any() and not fits[fewer].any():
        binding = excluded_by(fewer)  # no chunking of fewer tasks fits: that binds too
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
        n: _chunks_of(d, int(c.n_chunks[k]), int(c.units[k]))
        for d, (n, (c, k)) in zip(problem.dims, pick.items(), strict=True)
    }
    return _make_plan(
        problem,
        budget,
        dask_chunks,
        {k: int(np.ceil(getattr(terms, k)[chosen])) for k in Footprint.TERMS},
        binding,
        float(seconds[chosen]),
        notes,
        aligned=bool(aligned[chosen]),
    )


def _chunks_of(dim: DimSpec, n_chunks: int, unit: int) -> tuple[int, ...]:
    """The chunk lengths of a candidate: regular, else balanced, or packed at boundaries.

    Regular where :func:`_regular` allows; packed between the dim's boundaries where it has them.

    Packed chunks are no longer than the balanced candidate's longest, which the plan priced.
    """
    balanced = balanced_chunks(dim.size, n_chunks, unit)
    if dim.boundaries:
        return packed_chunks(dim.boundaries, max(balanced))
    return _regular(dim, balanced, unit) or balanced


def _regular(dim: DimSpec, balanced: tuple[int, ...], unit: int) -> tuple[int, ...] | None:
    """``balanced``'s count of chunks as Zarr stores them: all of its longest but the last.

    The same tasks, the same longest chunk (the plan's peak): a result written to Zarr keeps
    them (``result.memchunk.to_zarr`` merged balanced ones, 61 and 60 steps, into regular ones,
    and each task held a neighbour's piece beside the operator: 105.25 MiB measured against
    90.62 MiB predicted). None where the last would be empty, or shorter than the dim allows
    (a halo's depth), and where it would be the source's own chunks though the candidate was
    priced as cutting them (element-wise, ``unit`` not a multiple of the source chunk): Dask
    would then skip the rechunk and fuse the operator into the task that makes each chunk,
    which the candidate's footprint does not count.
    """
    longest, n_chunks = max(balanced), len(balanced)
    source = min(dim.storage_chunk, dim.size) if dim.storage_chunk else 0
    if source and longest == source and unit % source:
        return None
    last = dim.size - (n_chunks - 1) * longest
    if last <= 0 or (n_chunks > 1 and last < dim.shortest_chunk):
        return None
    return (longest,) * (n_chunks - 1) + (last,)


def _cut(dim: DimSpec, candidates: DimCandidates, index: np.ndarray) -> DimCut:
    """The candidates of one dim, spread over the grid of combinations."""
    return DimCut(
        size=dim.size,
        lengths=candidates.lengths[index],
        n_chunks=candidates.n_chunks[index],
        padded=candidates.padded[index],
        units=candidates.units[index],
        halo=dim.halo_depth > 0,
    )


def _make_plan(
    problem: PlanProblem,
    budget: Budget,
    dask_chunks: Mapping[str, tuple[int, ...]],
    terms: Mapping[str, int],
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
        predicted_peak_bytes=sum(terms.values()),
        predicted_task_bytes=terms["task"],
        gather_bytes=terms["gather"],
        held_bytes=terms["held"],
        factors_bytes=terms["factors"],
        produce_bytes=terms["produce"],
        graph_bytes=terms["graph"],
        runtime_bytes=terms["runtime"],
        budget=budget,
        n_chunks=int(np.prod([len(c) for c in dask_chunks.values()])),
        binding=binding,
        halo={d.name: d.depth for d in problem.dims if d.halo_depth},
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
    cuts = _cuts_of(problem, dask_chunks)
    terms = _footprint(problem, budget, cuts)
    n_tasks = int(np.prod([len(dask_chunks[d.name]) for d in problem.dims]))
    read = _padded_over(cuts, cuts)  # a rechunk reads (copies) what the task holds
    seconds = float(_estimated_seconds(problem, n_tasks, cuts, read, budget)[0])
    aligned = all(
        not d.storage_chunk or all(c % d.storage_chunk == 0 for c in dask_chunks[d.name][:-1])
        for d in problem.dims
    )
    notes = list(problem.notes)
    beyond = _beyond_measured_range(problem, cuts)
    if beyond:
        notes.append(
            f"your chunks' tasks go beyond what the memory model was measured on ({beyond}): "
            f"the prediction extrapolates its fit there"
        )
    return _make_plan(
        problem,
        budget,
        {d.name: tuple(dask_chunks[d.name]) for d in problem.dims},
        {k: int(np.ceil(getattr(terms, k)[0])) for k in Footprint.TERMS},
        Binding.USER_CHUNKS,
        seconds,
        notes,
        aligned=aligned,
    )


def _cuts_of(problem: PlanProblem, dask_chunks: Mapping[str, tuple[int, ...]]) -> dict[str, DimCut]:
    """One chunking's cuts (of ``dask_chunks``, every dim of ``problem``), as the search's."""
    cuts = {}
    for d in problem.dims:
        chunks = tuple(int(c) for c in dask_chunks[d.name])
        depth = d.depth if d.role is DimRole.HALO else 0
        cuts[d.name] = DimCut(
            size=d.size,
            lengths=np.array([max(chunks)]),
            n_chunks=np.array([len(chunks)]),
            padded=np.array([padded_extent(max(chunks), len(chunks), depth)]),
            units=np.array([math.gcd(*chunks[:-1]) if len(chunks) > 1 else chunks[0]]),
            halo=d.halo_depth > 0,
        )
    return cuts


def operator_peak_within(
    problem: PlanProblem,
    budget: Budget,
    dask_chunks: Mapping[str, tuple[int, ...]],
    in_task_bytes: float,
) -> float:
    """The operator's own peak at which a plan's prediction inside a task is ``in_task_bytes``.

    Inside a task, the plan predicts the operator's peak, getting its input (``gather``) and
    producing it (``produce``). Where the input is read from a file, or made by a graph before
    the operator runs, those phases end before its work starts and add only where they are
    larger (:func:`~xarray_memchunk.planning.footprint.footprint`): the prediction is then the
    largest phase, not the sum. A task measured at ``in_task_bytes`` is explained by the
    operator's peak this returns: raising the operator's model to it raises the prediction to
    the measurement, where subtracting the other phases' terms would leave the prediction where
    it was (a read phase of 83 MiB beside a task of 40 MiB, measured at 159 MiB: the task is
    159 MiB, not 76). Found by bisection: the prediction is at least the operator's peak and
    grows with it.

    Parameters
    ----------
    problem, budget
        What the plan was made from.
    dask_chunks
        The plan's chunks.
    in_task_bytes
        A task's measured peak, less what the slot counts apart (compiled code).

    Returns
    -------
    float
        At most ``in_task_bytes``; 0 where the other phases alone reach it.
    """
    cuts = _cuts_of(problem, dask_chunks)

    def in_task(operator: float) -> float:
        terms = _footprint(problem, budget, cuts, np.array([operator]))
        return float(terms.task[0] + terms.gather[0] + terms.produce[0])

    low, high = 0.0, max(0.0, float(in_task_bytes))
    if in_task(low) >= high:
        return low
    while high - low > max(1.0, 1e-6 * high):
        middle = (low + high) / 2
        if in_task(middle) >= in_task_bytes:
            high = middle
        else:
            low = middle
    return high


def _beyond_measured_range(problem: PlanProblem, cuts: Mapping[str, DimCut]) -> str:
    """Where one plan's chunks (``cuts``) pass the model's measured range, in words; or ""."""
    return "; ".join(
        f"{float(counted[0]):,.0f} {what}, measured up to {cap:,.0f}"
        for what, counted, cap in _range_limits(problem, cuts)
        if counted[0] > cap
    )


def _padded_over(cuts: Mapping[str, DimCut], dims: Iterable[str]) -> np.ndarray:
    """A task's padded elements over ``dims`` (those of ``cuts``), per candidate."""
    return np.prod([cuts[d].padded for d in dims if d in cuts], axis=0, dtype=np.float64)


def _range_limits(
    problem: PlanProblem, cuts: Mapping[str, DimCut]
) -> list[tuple[str, np.ndarray, float]]:
    """Each limit of the model's measured range: what it counts, per candidate, and its cap.

    The task's padded elements (:attr:`PlanProblem.max_task_elements`), a variable's over its
    own dims (:attr:`PlanProblem.task_element_caps`), a dim's padded extent
    (:attr:`PlanProblem.max_extents`).
    """
    limits = []
    if problem.max_task_elements:
        limits.append(("elements", _padded_over(cuts, cuts), problem.max_task_elements))
    limits += [
        (f"elements over {', '.join(dims)}", _padded_over(cuts, dims), cap)
        for dims, cap in problem.task_element_caps
    ]
    limits += [
        (f"along {name}", cuts[name].padded, cap)
        for name, cap in problem.max_extents.items()
        if name in cuts
    ]
    return limits

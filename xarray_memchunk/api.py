"""Plan and apply operators on xarray objects: the functions behind the ``.memchunk`` accessor."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr
from dask.array.overlap import ensure_minimum_chunksize

from .clusters import active_client, task_overhead_seconds
from .errors import (
    BudgetError,
    CalibrationError,
    DimensionError,
    InfeasiblePlanError,
    MemchunkError,
    MemoryBudgetWarning,
)
from .measure.calibrate import self_calibrate
from .measure.runs import RunReport, input_layers, report, track
from .memory_limits import Budget, resolve_budget
from .models import load_calibration
from .models.learned import Learned, load_learned, settle_observations
from .operators import BlockwiseOperator, Operator, get_operator
from .operators.cost import TaskCost, resolve_cost
from .operators.sources import device_of, read_chunked, storage_chunks
from .operators.staging import WRITE_COPIES, StagingSite, stage, staging_site
from .planning.budget import format_size
from .planning.footprint import InputKind
from .planning.plan import ChunkPlan
from .planning.problem import DimRole, DimSpec, PlanProblem
from .planning.roles import merge_dims
from .planning.search import plan_chunks, plan_for_chunks

__all__ = ["Plan", "apply", "plan", "storage_chunks"]

Chunks = Mapping[str, Any] | str | int | None


@dataclass(frozen=True)
class Plan(ChunkPlan):
    """A :class:`ChunkPlan` that can report on its run.

    After ``apply`` with this plan's chunks and a computation on a ``distributed`` cluster,
    :meth:`report` compares the measured task peaks with the prediction and learns from them.
    """

    def report(self, learn: bool = True) -> RunReport:
        """Predicted against measured for the last run of this plan; see :func:`runs.report`.

        Parameters
        ----------
        learn
            Grow the operator's calibration where the run exceeded the prediction (or a
            worker was paused or killed).
        """
        return report(self, learn)


@dataclass(frozen=True)
class _Prepared:
    operator: Operator
    kwargs: dict[str, Any]
    costs: dict[str, TaskCost]  # variable name -> its resolved cost
    plan: ChunkPlan
    staged: tuple[str, ...] = ()  # variables written to a temporary store before the run
    staging: StagingSite | None = None


def data_device(obj: xr.DataArray | xr.Dataset) -> str:
    """The one device the data lives on, ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    MemchunkError
        When a Dataset mixes NumPy and CuPy variables.
    """
    arrays = obj.data_vars.values() if isinstance(obj, xr.Dataset) else [obj]
    devices = {device_of(da) for da in arrays} or {"cpu"}
    if len(devices) > 1:
        raise MemchunkError(
            "the Dataset mixes NumPy (CPU) and CuPy (GPU) variables: select the variables of "
            "one device, or move them with .as_numpy() / .map_blocks(cupy.asarray)"
        )
    (device,) = devices
    return device


def _device(obj: xr.DataArray | xr.Dataset, operator: Operator) -> str:
    """The one device the data lives on; an error if the operator cannot run there."""
    device = data_device(obj)
    if device not in operator.devices:
        raise MemchunkError(
            f"{operator.name!r} runs on NumPy (CPU) data, and this data holds CuPy (GPU) "
            f"arrays: convert it with .as_numpy() first, or use an operator that runs on the "
            f"GPU (the reductions)"
        )
    return device


def _cost(
    operator: Operator,
    name: str,
    da: xr.DataArray,
    kwargs: dict[str, Any],
    device: str,
    budget: Budget,
    notes: list[str],
) -> TaskCost:
    """Resolve one variable's cost, measuring the operator first where nothing else is known.

    A self-calibrating operator without a calibration is measured in a worker
    (:func:`~xarray_memchunk.measure.calibrate.self_calibrate`), and so is a NumPy function whose
    last run says its model is wrong (:attr:`Learned.asks_for_measuring`: memory killed a
    worker running its task, or a task needed more than twice its prediction). The plan's
    notes say so.
    """
    key = operator.cost_terms(**kwargs).calibration
    dtype = np.dtype(da.dtype).name
    known = load_calibration(key, device, dtype)
    learned = load_learned(key, device, dtype)
    wrong = learned is not None and learned.asks_for_measuring
    measurable = isinstance(operator, BlockwiseOperator)  # a NumPy function can measure itself
    doubt = operator.unknown_identity(**kwargs) if measurable else ""
    if doubt:  # a cached model may belong to another function: never reused, measured now
        notes.append(f"the identity of {operator.name!r} is not certain ({doubt}): measured now")
    unknown = known is None or bool(doubt)
    if measurable and ((operator.self_calibrating and unknown) or wrong):
        if device != "cpu":
            raise CalibrationError(
                f"operator {operator.name!r} calibrates itself on the CPU only; give it a "
                f"memory_model for CuPy data"
            )
        operator.dim_uses(da, **kwargs)  # missing dims: say so before measuring anything
        if wrong:
            notes.append(f"{_found_wrong(operator, learned)}: measured again now")
        notes.append(self_calibrate(operator, da, kwargs, budget.per_task).explain())
        if wrong:
            settle_observations(key, device, dtype)
    elif wrong:
        notes.append(
            f"{_found_wrong(operator, learned)}: planned with the model raised x2 at most; "
            f"measure it on this machine with `memchunk calibrate {operator.name}`"
        )
    return resolve_cost(operator, name, da, kwargs, device)


def _found_wrong(operator: Operator, learned: Learned) -> str:
    """What the last run said of the operator's model, for the plan's notes."""
    return (
        f"the last run of {operator.name!r} found its model wrong (a worker killed by memory in "
        f"its task, or a task over twice its prediction; {learned.path})"
    )


def _resolve(
    obj: xr.DataArray | xr.Dataset,
    operator: Operator,
    kwargs: dict[str, Any],
    device: str,
    budget: Budget,
    notes: list[str],
) -> tuple[dict[str, xr.DataArray], dict[str, TaskCost], dict[str, str], dict[str, Any]]:
    """Resolve each variable once: the ones planned, their costs, the others with the reason.

    Returns ``(variables, costs, left_out, kwargs)``, ``kwargs`` bound to the variables (CF
    names resolved). What self-calibration did is appended to ``notes``.

    Raises
    ------
    MemchunkError
        A DataArray the operator does not apply to (:class:`DimensionError` for missing dims),
        or a Dataset none of whose variables it applies to.
    """
    if isinstance(obj, xr.DataArray):
        name = str(obj.name) if obj.name is not None else "<array>"
        kwargs = operator.bind(obj, kwargs)
        cost = _cost(operator, name, obj, kwargs, device, budget, notes)
        return {name: obj}, {name: cost}, {}, kwargs
    if not obj.data_vars:
        raise MemchunkError("the Dataset has no data variables to apply the operator to")
    variables, costs, left_out, errors, bound = {}, {}, {}, [], None
    for key, da in obj.data_vars.items():
        name = str(key)
        try:
            own = operator.bind(da, kwargs)
            costs[name] = _cost(operator, name, da, own, device, budget, notes)
        except CalibrationError:  # a broken file or measurement: not this variable's fault
            raise
        except MemchunkError as exc:
            errors.append(exc)
            left_out[name] = operator.skipped(da, str(exc), **kwargs)
            continue
        variables[name], bound = da, bound or own
    if not variables:
        first = errors[0]
        raise type(first)(
            f"no variable of the Dataset suits operator {operator.name!r}: "
            + "; ".join(f"{name}: {exc}" for name, exc in zip(left_out, errors, strict=True))
        )
    return variables, costs, left_out, bound


def _check_dims(obj: xr.DataArray | xr.Dataset, operator: str) -> None:
    """Refuse dims that cannot be planned: every plan and chunk mapping is keyed by dim name.

    Raises
    ------
    DimensionError
        Dims not named by strings, a variable naming one dim twice, or 0-d data (one value:
        nothing to chunk).
    """
    odd = [d for d in obj.dims if not isinstance(d, str)]
    if odd:
        raise DimensionError(
            f"memchunk needs dims named by strings; {odd!r} are not: rename them first, "
            f"e.g. obj.rename({{{odd[0]!r}: 'x'}})"
        )
    dataset = isinstance(obj, xr.Dataset)
    arrays = obj.data_vars.items() if dataset else [("", obj)]
    for name, da in arrays:
        if len(set(da.dims)) < len(da.dims):
            which = f"variable {name!r}" if dataset else "the DataArray"
            raise DimensionError(
                f"{which} has dims {da.dims}, one name twice: memchunk plans chunks by dim "
                f"name; give each axis its own name first, e.g. xr.DataArray(da.data, "
                f"dims=('x', 'x2'))"
            )
    if arrays and all(da.ndim == 0 for _, da in arrays):
        raise DimensionError(
            f"the data is 0-d (one value per variable): there is nothing to chunk for "
            f"{operator!r}; compute it with xarray directly"
        )


def _peak_function(costs: Mapping[str, TaskCost]):
    """Predicted peak of the worst variable's task, from padded extents of every dim."""

    def peak(extents: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.max(np.stack([np.asarray(c.peak_bytes(extents)) for c in costs.values()]), 0)

    return peak


def _normalize_user_chunks(
    chunks: Chunks,
    targets: Mapping[str, xr.DataArray],
    specs: tuple[DimSpec, ...],
    cautions: list[str],
    notes: list[str],
) -> dict[str, tuple[int, ...]]:
    """Turn ``.chunk()``-style chunks into chunk tuples for every planned dim.

    Chunks that split a dim the operator needs whole are merged, with a line in ``cautions``;
    halo chunks shorter than the halo are merged into their neighbours (as ``map_overlap``
    would), with a line in ``notes``: the plan describes the chunks that will run.
    """
    da = next(iter(targets.values()))
    if not isinstance(chunks, Mapping):
        chunks = {s.name: chunks for s in specs}
    unknown = set(chunks) - {s.name for s in specs}
    if unknown:
        raise DimensionError(
            f"chunks name dims {sorted(map(str, unknown))} that the data lacks; "
            f"dims are {[s.name for s in specs]}"
        )
    current = {
        str(d): c
        for t in targets.values()
        if t.chunks
        for d, c in zip(t.dims, t.chunks, strict=True)
    }
    result: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        value = chunks.get(spec.name, current.get(spec.name, -1))
        _check_chunk_value(spec.name, value)
        try:
            (normalized,) = dask.array.core.normalize_chunks(
                (value,), shape=(spec.size,), dtype=da.dtype
            )
        except (ValueError, TypeError) as exc:
            raise MemchunkError(f"invalid chunks for dim {spec.name!r}: {value!r} ({exc})") from exc
        result[spec.name] = tuple(int(c) for c in normalized)
    if any(v == "auto" for v in chunks.values()):  # "auto" sizes depend on every dim at once
        shape = tuple(s.size for s in specs)
        spec_chunks = tuple(chunks.get(s.name, result[s.name]) for s in specs)
        auto = dask.array.core.normalize_chunks(spec_chunks, shape=shape, dtype=da.dtype)
        result = {s.name: tuple(int(c) for c in a) for s, a in zip(specs, auto, strict=True)}
    for spec in specs:
        if spec.role is DimRole.WHOLE and len(result[spec.name]) > 1:
            cautions.append(
                f"{spec.name!r} must be one chunk for this operator; the given chunks split it "
                f"in {len(result[spec.name])}: it will be rechunked whole"
            )
            result[spec.name] = (spec.size,)
        split = result[spec.name]
        shortest = spec.shortest_chunk
        if len(split) > 1 and min(split) < shortest:
            merged = ensure_minimum_chunksize(shortest, split) if spec.size >= shortest else ()
            result[spec.name] = merged or (spec.size,)
            halo = spec.role is DimRole.HALO and spec.depth == shortest
            why = f"the operator's shortest chunk, {shortest}"
            if halo:
                why = f"its halo of {shortest}"
            notes.append(
                f"chunks along {spec.name!r} shorter than {why}, merged into their neighbours"
                + (", as dask's map_overlap does" if halo else "")
                + f": {result[spec.name]}"
            )
    return result


def _check_chunk_value(dim: str, value: Any) -> None:
    """Check one dim's ``.chunk()`` value.

    A positive int, -1 or None (the whole dim), ``"auto"``, or a tuple of positive ints.
    """
    if value is None or value == -1 or (isinstance(value, str) and value == "auto"):
        return
    values = value if isinstance(value, tuple | list) else (value,)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v <= 0:
            raise MemchunkError(
                f"invalid chunks for dim {dim!r}: {value!r}; give a positive length, -1 for "
                f"the whole dim, 'auto', or a tuple of positive lengths"
            )


def _budget(memory_limit: int | str | None, budget: Budget | None, device: str) -> Budget:
    """The given :class:`Budget`, or one from the worker memory limit (given or discovered)."""
    if budget is None:
        return resolve_budget(memory_limit, device)
    if not isinstance(budget, Budget):
        raise BudgetError(
            f"budget= takes a Budget, got {budget!r}; give a worker's memory limit as "
            f"memory_limit={budget!r}"
        )
    if memory_limit is not None:
        raise BudgetError("give memory_limit= or budget=, not both")
    return budget


def _prepare(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    memory_limit: int | str | None,
    budget: Budget | None,
    chunks: Chunks,
    op_kwargs: dict[str, Any],
) -> _Prepared:
    """Plan the first of the operator's alternatives that fits the budget.

    With user ``chunks`` an alternative fits when those chunks are predicted to; when none
    does, the one with the smallest predicted peak is taken and a
    :class:`MemoryBudgetWarning` says so. Warnings are issued for the chosen one only. Staging
    a graph's data on disk is the last resort: tried only where no alternative fits in memory.
    """
    operator = get_operator(op)
    if not isinstance(obj, xr.DataArray | xr.Dataset):
        raise MemchunkError(
            f"memchunk works on xarray Dataset and DataArray objects, not {type(obj).__name__}"
        )
    _check_dims(obj, operator.name)
    device = _device(obj, operator)
    resolved = _budget(memory_limit, budget, device)
    alternatives = operator.alternatives(operator.normalize_kwargs(**op_kwargs))
    chosen = None
    resolutions: dict[int, _Alternative] = {}  # resolved (and measured) once for both passes
    for staging in (False, True):
        failures: list[tuple[str, str]] = []  # (alternative, why it was not taken)
        over_budget: list[tuple[str, _Prepared, list[str]]] = []
        for index, (label, kwargs, reason) in enumerate(alternatives):
            if kwargs is None:
                failures.append((label, reason))
                continue
            try:
                if index not in resolutions:
                    resolutions[index] = _alternative(obj, operator, resolved, device, kwargs)
                prepared, cautions = _prepare_one(
                    operator, resolved, chunks, resolutions[index], staging=staging
                )
            except InfeasiblePlanError as exc:
                failures.append((label, str(exc)))
                continue
            if prepared.plan.fits:
                chosen = (label, prepared, cautions)
                break
            over_budget.append((label, prepared, cautions))
            peak = resolved.format(prepared.plan.predicted_peak_bytes)
            failures.append((label, f"the given chunks are predicted to need {peak} per task"))
        if chosen is not None or over_budget:
            break
    if chosen is None:
        if not over_budget:
            if len(alternatives) == 1:
                raise InfeasiblePlanError(failures[0][1])
            raise InfeasiblePlanError("; ".join(f"{what}: {why}" for what, why in failures))
        chosen = min(over_budget, key=lambda c: c[1].plan.predicted_peak_bytes)
    label, prepared, cautions = chosen
    for caution in cautions:
        warnings.warn(caution, MemoryBudgetWarning, stacklevel=4)
    notes = prepared.plan.notes
    if len(alternatives) > 1:
        why = [f"{label} chosen"] + [f"not {w}: {r}" for w, r in failures if w != label]
        notes = (*notes, "; ".join(why))
    fields = {f.name: getattr(prepared.plan, f.name) for f in dataclasses.fields(ChunkPlan)}
    return replace(prepared, plan=Plan(**(fields | {"notes": notes})))


@dataclass(frozen=True)
class _Alternative:
    """One way of running the operator, resolved: its variables, their costs, its problem."""

    kwargs: dict[str, Any]  # bound to the variables (CF names resolved)
    targets: dict[str, xr.DataArray]
    costs: dict[str, TaskCost]
    problem: PlanProblem


def _alternative(
    obj: xr.DataArray | xr.Dataset,
    operator: Operator,
    resolved: Budget,
    device: str,
    kwargs: dict[str, Any],
) -> _Alternative:
    """Resolve one alternative's variables and costs (measuring what must be) and its problem."""
    fresh: list[str] = []
    targets, costs, skipped, kwargs = _resolve(obj, operator, kwargs, device, resolved, fresh)
    specs = merge_dims(
        [(c.dims, c.sizes, c.uses, storage_chunks(targets[n])) for n, c in costs.items()]
    )
    empty = [s.name for s in specs if s.size == 0]
    if empty:
        raise DimensionError(
            f"dim {empty[0]!r} has length 0: there is nothing to compute; select a non-empty "
            f"range first"
        )
    problem = PlanProblem(
        operator=operator.name,
        dims=specs,
        peak_bytes=_peak_function(costs),
        seconds_per_element=max(c.seconds_per_element for c in costs.values()),
        task_overhead_s=task_overhead_seconds() * max(c.tasks_per_chunk for c in costs.values()),
        notes=(*fresh, *_notes(costs, skipped)),
        inputs=tuple(c.layout for c in costs.values()),
        max_task_elements=min(
            (c.max_task_elements for c in costs.values() if c.max_task_elements), default=None
        ),
        max_extents=_max_extents(costs),
    )
    return _Alternative(kwargs, targets, costs, problem)


def _prepare_one(
    operator: Operator,
    resolved: Budget,
    chunks: Chunks,
    alternative: _Alternative,
    *,
    staging: bool = False,
) -> tuple[_Prepared, list[str]]:
    """Plan one alternative; also return the warnings it would issue if chosen.

    ``staging``: where no plan fits in memory, try staging the graph's data on disk.
    """
    kwargs, costs, problem = alternative.kwargs, alternative.costs, alternative.problem
    if chunks is None:
        try:
            return _Prepared(operator, kwargs, costs, plan_chunks(problem, resolved)), []
        except InfeasiblePlanError as in_memory:
            if not staging:
                raise
            return _staged(operator, kwargs, costs, problem, resolved, in_memory), []
    cautions: list[str] = []
    notes: list[str] = []
    user_chunks = _normalize_user_chunks(chunks, alternative.targets, problem.dims, cautions, notes)
    problem = replace(problem, notes=(*problem.notes, *notes))
    chunk_plan = plan_for_chunks(problem, resolved, user_chunks)
    if not chunk_plan.fits:
        cautions.append(
            "the given chunks are predicted to need "
            f"{resolved.format(chunk_plan.predicted_peak_bytes)} per {operator.name!r} task, "
            f"over the per-task budget of {resolved.format(resolved.per_task)}: workers may "
            "pause or be killed. Leave chunks out to let memchunk choose."
        )
    return _Prepared(operator, kwargs, costs, chunk_plan), cautions


def _staged(
    operator: Operator,
    kwargs: dict[str, Any],
    costs: dict[str, TaskCost],
    problem: PlanProblem,
    budget: Budget,
    in_memory: InfeasiblePlanError,
) -> _Prepared:
    """Plan with the graph variables staged on disk, where rechunking them in memory cannot fit.

    Raises
    ------
    InfeasiblePlanError
        ``in_memory``'s reason, and why staging cannot do it either (a write task over the
        budget, no room on disk, no shared directory, or no plan even reading from disk).
    """
    graphs = {n: c for n, c in costs.items() if c.layout.kind is InputKind.GRAPH}
    if not graphs:
        raise in_memory
    size = budget.format
    write_task = max(
        WRITE_COPIES * c.dtype.itemsize * float(np.prod(list(c.layout.source_chunks.values())))
        + c.layout.produce_bytes
        for c in graphs.values()
    )
    if write_task > budget.per_task:
        raise InfeasiblePlanError(
            f"{in_memory}. Nor can it be staged on disk: writing one of the data's chunks "
            f"needs {size(write_task)}, over the per-task budget of {size(budget.per_task)}: "
            f"give the data smaller chunks first (.chunk(...))"
        ) from None
    nbytes = sum(c.dtype.itemsize * int(np.prod(list(c.sizes.values()))) for c in graphs.values())
    site = staging_site(nbytes, active_client())
    if site.refusal:
        raise InfeasiblePlanError(
            f"{in_memory}. Nor can it be staged on disk: {site.refusal}"
        ) from None
    inputs = tuple(
        replace(c.layout, kind=InputKind.FILE) if n in graphs else c.layout
        for n, c in costs.items()
    )
    note = (
        f"the data's chunks cannot be rechunked in memory within the budget, so apply first "
        f"writes {', '.join(graphs)} as it comes to a temporary Zarr store in {site.directory} "
        f"({size(nbytes)}; each write task holds up to {size(write_task)}; disk measured at "
        f"{site.bytes_per_second / 1e6:.0f} MB/s: about {site.seconds(nbytes):.0f} s written "
        f"and read back), and each task reads its block from it"
    )
    staged_problem = replace(problem, inputs=inputs, notes=(*problem.notes, note))
    try:
        chunk_plan = plan_chunks(staged_problem, budget)
    except InfeasiblePlanError as on_disk:
        raise InfeasiblePlanError(
            f"{in_memory}. Staged on disk, it does not fit either: {on_disk}"
        ) from None
    return _Prepared(operator, kwargs, costs, chunk_plan, tuple(graphs), site)


def _max_extents(costs: Mapping[str, TaskCost]) -> dict[str, float]:
    """The smallest measured extent per dim over the variables, where a model has one."""
    caps: dict[str, float] = {}
    for cost in costs.values():
        for dim, cap in cost.max_extents.items():
            caps[dim] = min(cap, caps.get(dim, cap))
    return caps


def _notes(costs: Mapping[str, TaskCost], skipped: Mapping[str, str]) -> tuple[str, ...]:
    notes = [f"memory model: {', '.join(sorted({c.model_source for c in costs.values()}))}"]
    notes += sorted({c.production.explain(format_size) for c in costs.values() if c.production})
    kinds = {c.layout.kind for c in costs.values()}
    if InputKind.FILE in kinds:
        notes.append("input read straight from its file: each task reads its own block")
    ranges = [c.max_task_elements for c in costs.values() if c.max_task_elements]
    if ranges:
        notes.append(
            f"memory model measured on tasks of up to {min(ranges):,.0f} elements (by "
            f"self-calibration): plans stay within them"
        )
    caps = _max_extents(costs)
    if caps:
        notes.append(
            "memory grew faster than the block along "
            + ", ".join(f"{d!r} (measured up to {n:,.0f})" for d, n in caps.items())
            + ": the model is not extrapolated along them"
        )
    notes += [f"left out: {name} ({reason})" for name, reason in skipped.items()]
    return tuple(notes)


def plan(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    memory_limit: int | str | None = None,
    budget: Budget | None = None,
    chunks: Chunks = None,
    **op_kwargs: Any,
) -> ChunkPlan:
    """Plan chunks for ``op`` on ``obj``; the operator itself is not run on the data.

    Planning reads metadata, with three exceptions, each stated in the plan's notes when it
    happens: a user function without a memory model is measured on a few blocks of its own
    (in a worker of the active cluster, or a child process); one block of a Dask graph's input
    is computed in this process to measure what producing it holds (once per graph;
    ``memchunk.measure-input: False`` turns it off); and where the data must be staged on disk,
    the staging directory's write speed is measured (64 MiB written once per process).

    Parameters
    ----------
    obj
        A Dataset or DataArray, chunked or numpy-backed (planned as one chunk).
    op
        A registered operator name (see :func:`xarray_memchunk.operator_names`) or an
        :class:`~xarray_memchunk.operators.Operator`.
    memory_limit
        Memory limit of one worker (``"1.5GB"`` or bytes), as ``LocalCluster(memory_limit=...)``
        takes it; discovered from the active ``distributed.Client``, the dask config or this
        machine when None.
    budget
        A ready :class:`Budget` (per-task bytes and the cluster's layout), instead of
        ``memory_limit``.
    chunks
        Skip the search and plan for these chunks (as :meth:`xarray.Dataset.chunk` takes them);
        a :class:`MemoryBudgetWarning` is issued when their predicted peak exceeds the budget.
    **op_kwargs
        The operator's own arguments (``dim=``, ``sigma=``, ...).

    Returns
    -------
    Plan
        A :class:`ChunkPlan`; ``plan.report()`` after a run on a cluster.

    Raises
    ------
    MemchunkError
        Unknown operator, missing dims, invalid memory limit, or no chunking that fits.
    """
    return _prepare(obj, op, memory_limit, budget, chunks, op_kwargs).plan


def apply(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    memory_limit: int | str | None = None,
    budget: Budget | None = None,
    chunks: Chunks = None,
    record_plan: bool = False,
    **op_kwargs: Any,
) -> xr.DataArray | xr.Dataset:
    """Rechunk ``obj`` per the plan and return the operator's lazy result.

    Takes the same arguments as :func:`plan`, and ``record_plan``: add the plan's one-line
    summary to the result's attributes as ``memchunk_plan`` (``memchunk run`` does, so that a
    written file says how it was computed). Dataset in, Dataset out: the reductions keep or
    drop the variables they do not reduce as xarray's own do, the other operators leave them
    out. DataArray in, DataArray out, named after the operator when the input has no name.
    Nothing is computed: call ``.compute()`` on the result, or write it with
    ``result.memchunk.to_zarr(path)`` (or ``.memchunk.to_netcdf(path)``). Those make the planned
    chunks uniform, as Zarr requires, and write atomically. Plain ``result.to_zarr()`` fails on
    balanced chunks such as (17, 17, 17, 17, 16, 16): Zarr wants every chunk of a dim but the
    last equal, and the last no larger (``plan.explain()`` says when the planned ones are not).
    """
    prepared = _prepare(obj, op, memory_limit, budget, chunks, op_kwargs)
    rechunked = _rechunk(obj, prepared)
    operator, kwargs = prepared.operator, prepared.kwargs
    uses = {name: cost.uses for name, cost in prepared.costs.items()}
    if isinstance(rechunked, xr.DataArray):
        (own,) = uses.values()
        result = operator.compute(rechunked, own, **kwargs)
    else:
        result = operator.compute_dataset(rechunked, uses, **kwargs)
    if isinstance(result, xr.DataArray) and result.name is None:
        result = result.rename(operator.name)
    if record_plan:
        result.attrs["memchunk_plan"] = _plan_summary(prepared.plan)
    track(prepared.plan, prepared, input_layers(rechunked))
    return result


def _rechunk(obj, prepared: _Prepared):
    """Bring each planned variable to the planned chunks, in the way that holds least.

    - Read straight from a file: the tasks read the planned chunks from the file (halos are
      read by the operator itself), so no chunk waits in a worker for other tasks.
    - Produced by a Dask graph that the plan stages on disk (a rechunk in memory would not
      fit): written as it comes to a temporary Zarr store now
      (:func:`~xarray_memchunk.operators.staging.stage`), then read as a file is.
    - Produced by a Dask graph: a task-based rechunk. Dask's P2P rechunk (chosen for large
      rechunks on a distributed cluster) buffers data outside tasks, beyond what the plan
      accounts for: it paused 600 MB workers in a test where the task-based one did not. Its
      intermediate blocks are capped at the planned chunk's bytes (``array.chunk-size``).
    - NumPy data: cut into the planned chunks.
    """
    chunks = prepared.plan.dask_chunks
    planned = {}
    for name, cost in prepared.costs.items():
        da = obj if isinstance(obj, xr.DataArray) else obj[name]
        own = {d: chunks[d] for d in cost.dims}
        if name in prepared.staged:
            da = stage(da, prepared.staging)
        if cost.layout.kind is InputKind.FILE or name in prepared.staged:
            planned[name] = read_chunked(da, own)
            continue
        chunk_bytes = cost.dtype.itemsize * int(np.prod([max(c) for c in own.values()]))
        limits = {"array.rechunk.method": "tasks", "array.chunk-size": f"{max(chunk_bytes, 1)}B"}
        with dask.config.set(limits):
            planned[name] = da.chunk(own)
    if isinstance(obj, xr.DataArray):
        return next(iter(planned.values()))
    # the other variables stay as they are: the operator decides what to keep of them
    return obj.assign(planned)


def _plan_summary(chunk_plan: ChunkPlan) -> str:
    chunks = ", ".join(f"{d}={c}" for d, c in chunk_plan.chunks.items())
    size = chunk_plan.budget.format
    return (
        f"{chunk_plan.operator}: chunks {chunks}; predicted peak per task "
        f"{size(chunk_plan.predicted_peak_bytes)} of {size(chunk_plan.budget.per_task)}"
    )

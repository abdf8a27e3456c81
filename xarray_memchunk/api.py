"""Plan and apply operators on xarray objects: the functions behind the ``.memchunk`` accessor."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr

from .budget import Budget, resolve_budget
from .errors import DimensionError, InfeasiblePlanError, MemchunkError, MemoryBudgetWarning
from .operators import DimUse, Operator, TaskModel, get_operator
from .planning.plan import ChunkPlan
from .planning.problem import TASK_OVERHEAD_S, DimRole, DimSpec, PlanProblem
from .planning.search import plan_chunks, plan_for_chunks
from .units import format_bytes

__all__ = ["apply", "plan", "storage_chunks"]

_ROLE_RANK = {DimRole.FREE: 0, DimRole.HALO: 1, DimRole.WHOLE: 2}

Chunks = Mapping[str, Any] | str | int | None


@dataclass(frozen=True)
class _Prepared:
    operator: Operator
    kwargs: dict[str, Any]
    uses: dict[str, dict[str, DimUse]]  # variable name -> dim -> use
    plan: ChunkPlan


def device_of(da: xr.DataArray) -> str:
    """``"gpu"`` when ``da`` holds CuPy data (or dask chunks of CuPy), else ``"cpu"``."""
    data = da.data
    meta = getattr(data, "_meta", data)
    return "gpu" if type(meta).__module__.split(".")[0] == "cupy" else "cpu"


def _device(obj: xr.DataArray | xr.Dataset, operator: Operator) -> str:
    """The one device the data lives on; an error if the operator cannot run there."""
    arrays = obj.data_vars.values() if isinstance(obj, xr.Dataset) else [obj]
    devices = {device_of(da) for da in arrays} or {"cpu"}
    if len(devices) > 1:
        raise MemchunkError(
            "the Dataset mixes NumPy (CPU) and CuPy (GPU) variables: select the variables of "
            "one device, or move them with .as_numpy() / .map_blocks(cupy.asarray)"
        )
    (device,) = devices
    if device not in operator.devices:
        raise MemchunkError(
            f"{operator.name!r} runs on NumPy (CPU) data, and this data holds CuPy (GPU) "
            f"arrays: convert it with .as_numpy() first, or use an operator that runs on the "
            f"GPU (the reductions)"
        )
    return device


def storage_chunks(da: xr.DataArray) -> dict[str, int | None]:
    """Storage chunk length per dim: on-disk chunks from the encoding, else current dask chunks."""
    preferred = da.encoding.get("preferred_chunks") or {}
    on_disk = da.encoding.get("chunks")
    result: dict[str, int | None] = {}
    for axis, dim in enumerate(da.dims):
        length = preferred.get(dim)
        if length is None and on_disk is not None and len(on_disk) == da.ndim:
            length = on_disk[axis]
        if length is None and da.chunks is not None:
            length = max(da.chunks[axis])
        result[str(dim)] = int(length) if length else None
    return result


def _targets(obj: xr.DataArray | xr.Dataset, operator: Operator, kwargs) -> dict[str, xr.DataArray]:
    if isinstance(obj, xr.DataArray):
        return {str(obj.name) if obj.name is not None else "<array>": obj}
    if isinstance(obj, xr.Dataset):
        found = {str(k): v for k, v in obj.data_vars.items() if operator.accepts(v, **kwargs)}
        if not found:
            # let the operator say what is missing, on the first variable
            first = next(iter(obj.data_vars.values()), None)
            if first is None:
                raise MemchunkError("the Dataset has no data variables to apply the operator to")
            operator.dim_uses(first, **kwargs)
            raise DimensionError(f"no variable of the Dataset suits operator {operator.name!r}")
        return found
    raise MemchunkError(
        f"memchunk works on xarray Dataset and DataArray objects, not {type(obj).__name__}"
    )


def _dim_specs(
    targets: Mapping[str, xr.DataArray], uses: Mapping[str, Mapping[str, DimUse]]
) -> tuple[DimSpec, ...]:
    specs: dict[str, DimSpec] = {}
    for name, da in targets.items():
        stored = storage_chunks(da)
        for dim, size in zip(da.dims, da.shape, strict=True):
            dim = str(dim)
            use = uses[name].get(dim, DimUse())
            old = specs.get(dim)
            if old is not None and _ROLE_RANK[old.role] > _ROLE_RANK[use.role]:
                use = DimUse(old.role, old.depth)
            depth = max(use.depth, old.depth if old else 0)
            storage = (old.storage_chunk if old else None) or stored[dim]
            specs[dim] = DimSpec(dim, int(size), use.role, depth, storage)
    return tuple(specs.values())


#: A rechunk task that assembles a planned chunk holds its pieces and the chunk at once.
RECHUNK_FACTOR = 2.0


def _peak_function(operator: Operator, targets, uses, kwargs):
    """Predicted peak of the worst task ``apply`` creates: the operator's, or the rechunk's.

    ``apply`` rechunks to the plan first; a task of that rechunk holds the pieces of a chunk
    and the chunk itself (:data:`RECHUNK_FACTOR` x its bytes), which exceeds an operator
    needing little more than its input (a median over a long axis).
    """
    models = {
        name: (da.dims, da.dtype, device_of(da), {str(d): int(n) for d, n in da.sizes.items()})
        for name, da in targets.items()
    }

    def peak(extents: Mapping[str, np.ndarray]) -> np.ndarray:
        worst = None
        for name, (dims, dtype, device, sizes) in models.items():
            own = {str(d): extents[str(d)] for d in dims}
            value = operator.peak_bytes(own, uses[name], dtype, device, sizes=sizes, **kwargs)
            elements = np.prod([np.asarray(v, dtype=np.float64) for v in own.values()], axis=0)
            value = np.maximum(value, RECHUNK_FACTOR * elements * np.dtype(dtype).itemsize)
            worst = value if worst is None else np.maximum(worst, value)
        return worst

    return peak


def _normalize_user_chunks(
    chunks: Chunks,
    targets: Mapping[str, xr.DataArray],
    specs: tuple[DimSpec, ...],
    cautions: list[str],
) -> dict[str, tuple[int, ...]]:
    """Turn ``.chunk()``-style chunks into chunk tuples for every planned dim.

    Chunks that split a dim the operator needs whole are merged, with a line in ``cautions``.
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
    return result


def _prepare(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    budget: Budget | int | str | None,
    chunks: Chunks,
    op_kwargs: dict[str, Any],
) -> _Prepared:
    """Plan the first of the operator's alternatives that fits the budget.

    With user ``chunks`` an alternative fits when those chunks are predicted to; when none
    does, the one with the smallest predicted peak is taken and a
    :class:`MemoryBudgetWarning` says so. Warnings are issued for the chosen one only.
    """
    operator = get_operator(op)
    resolved = resolve_budget(budget, _device(obj, operator))
    alternatives = operator.alternatives(operator.normalize_kwargs(**op_kwargs))
    failures: list[tuple[str, str]] = []  # (alternative, why it was not taken)
    over_budget: list[tuple[str, _Prepared, list[str]]] = []
    chosen = None
    for label, kwargs in alternatives:
        try:
            prepared, cautions = _prepare_one(obj, operator, resolved, chunks, kwargs)
        except InfeasiblePlanError as exc:
            if len(alternatives) == 1:
                raise
            failures.append((label, str(exc)))
            continue
        if prepared.plan.fits:
            chosen = (label, prepared, cautions)
            break
        over_budget.append((label, prepared, cautions))
        peak = format_bytes(prepared.plan.predicted_peak_bytes)
        failures.append((label, f"the given chunks are predicted to need {peak} per task"))
    if chosen is None:
        if not over_budget:
            raise InfeasiblePlanError("; ".join(f"{what}: {why}" for what, why in failures))
        chosen = min(over_budget, key=lambda c: c[1].plan.predicted_peak_bytes)
    label, prepared, cautions = chosen
    for caution in cautions:
        warnings.warn(caution, MemoryBudgetWarning, stacklevel=4)
    if len(alternatives) > 1:
        why = [f"{label} chosen"] + [f"not {w}: {r}" for w, r in failures if w != label]
        plan = replace(prepared.plan, notes=(*prepared.plan.notes, "; ".join(why)))
        prepared = replace(prepared, plan=plan)
    return prepared


def _prepare_one(
    obj: xr.DataArray | xr.Dataset,
    operator: Operator,
    resolved: Budget,
    chunks: Chunks,
    kwargs: dict[str, Any],
) -> tuple[_Prepared, list[str]]:
    """Plan one alternative; also return the warnings it would issue if chosen."""
    targets = _targets(obj, operator, kwargs)
    kwargs = operator.bind(next(iter(targets.values())), kwargs)
    uses = {name: operator.dim_uses(da, **kwargs) for name, da in targets.items()}
    specs = _dim_specs(targets, uses)
    task_models = [
        operator.task_model(da.dtype, device_of(da), **kwargs) for da in targets.values()
    ]
    problem = PlanProblem(
        operator=operator.name,
        dims=specs,
        peak_bytes=_peak_function(operator, targets, uses, kwargs),
        seconds_per_element=max(m.seconds_per_element for m in task_models)
        * operator.passes(**kwargs),
        task_overhead_s=TASK_OVERHEAD_S * operator.tasks_per_chunk(**kwargs),
        notes=_model_notes(task_models, targets, obj),
    )
    if chunks is None:
        return _Prepared(operator, kwargs, uses, plan_chunks(problem, resolved)), []
    cautions: list[str] = []
    user_chunks = _normalize_user_chunks(chunks, targets, specs, cautions)
    chunk_plan = plan_for_chunks(problem, resolved, user_chunks)
    if not chunk_plan.fits:
        cautions.append(
            "the given chunks are predicted to need "
            f"{format_bytes(chunk_plan.predicted_peak_bytes)} per {operator.name!r} task, "
            f"over the per-task budget of {format_bytes(resolved.per_task)}: workers may "
            "pause or be killed. Leave chunks out to let memchunk choose."
        )
    return _Prepared(operator, kwargs, uses, chunk_plan), cautions


def _model_notes(task_models: list[TaskModel], targets, obj) -> tuple[str, ...]:
    notes = [f"memory model: {', '.join(sorted({m.source for m in task_models}))}"]
    if isinstance(obj, xr.Dataset):
        left = sorted(set(map(str, obj.data_vars)) - set(targets))
        if left:
            notes.append(f"variables without the operator's dims are left out: {', '.join(left)}")
    return tuple(notes)


def plan(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    budget: Budget | int | str | None = None,
    chunks: Chunks = None,
    **op_kwargs: Any,
) -> ChunkPlan:
    """Plan chunks for ``op`` on ``obj`` without running anything.

    Parameters
    ----------
    obj
        A Dataset or DataArray, chunked or numpy-backed (planned as one chunk).
    op
        A registered operator name (see :func:`xarray_memchunk.operators`) or an
        :class:`~xarray_memchunk.operators.Operator`.
    budget
        Memory limit of one worker (``"1.5GB"`` or bytes), or a :class:`Budget`; discovered
        from the active ``distributed.Client``, the dask config or this machine when None.
    chunks
        Skip the search and plan for these chunks (as :meth:`xarray.Dataset.chunk` takes them);
        a :class:`MemoryBudgetWarning` is issued when their predicted peak exceeds the budget.
    **op_kwargs
        The operator's own arguments (``dim=``, ``sigma=``, ...).

    Returns
    -------
    ChunkPlan

    Raises
    ------
    MemchunkError
        Unknown operator, missing dims, invalid budget, or no chunking that fits.
    """
    return _prepare(obj, op, budget, chunks, op_kwargs).plan


def apply(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    budget: Budget | int | str | None = None,
    chunks: Chunks = None,
    **op_kwargs: Any,
) -> xr.DataArray | xr.Dataset:
    """Rechunk ``obj`` per the plan and return the operator's lazy result.

    Takes the same arguments as :func:`plan`. Dataset in, Dataset out (variables without the
    operator's dims are left out); DataArray in, DataArray out. Nothing is computed: call
    ``.compute()``, ``.to_zarr()`` or ``.memchunk.to_zarr()`` on the result.
    """
    prepared = _prepare(obj, op, budget, chunks, op_kwargs)
    rechunked = _rechunk(obj, prepared)
    operator, kwargs = prepared.operator, prepared.kwargs
    if isinstance(rechunked, xr.DataArray):
        (uses,) = prepared.uses.values()
        result = operator.compute(rechunked, uses, **kwargs)
    else:
        result = operator.compute_dataset(rechunked[list(prepared.uses)], prepared.uses, **kwargs)
    result.attrs["memchunk_plan"] = _plan_summary(prepared.plan)
    return result


def _rechunk(obj, prepared: _Prepared):
    """Rechunk to the plan as a task graph whose every task the plan bounds.

    Dask's P2P rechunk (chosen for large rechunks on a distributed cluster) buffers data outside
    tasks, beyond what the plan accounts for: it paused 600 MB workers in a test where the
    task-based rechunk did not. The task-based one is used, its intermediate blocks capped at
    the planned chunk's bytes (``array.chunk-size``) so no rechunk task exceeds
    :data:`RECHUNK_FACTOR` x a planned chunk.
    """
    dask_chunks = {d: c for d, c in prepared.plan.dask_chunks.items() if d in obj.dims}
    if isinstance(obj, xr.Dataset):
        obj = obj[list(prepared.uses)]
    itemsize = max(np.dtype(v.dtype).itemsize for v in _arrays(obj))
    chunk_bytes = itemsize * int(np.prod([max(c) for c in dask_chunks.values()]))
    limits = {"array.rechunk.method": "tasks", "array.chunk-size": f"{max(chunk_bytes, 1)}B"}
    with dask.config.set(limits):
        # only the data variables planned are rechunked; index coords stay in memory
        return obj.chunk(dask_chunks)


def _arrays(obj: xr.DataArray | xr.Dataset) -> list[xr.DataArray]:
    return [obj] if isinstance(obj, xr.DataArray) else list(obj.data_vars.values())


def _plan_summary(chunk_plan: ChunkPlan) -> str:
    chunks = ", ".join(f"{d}={c}" for d, c in chunk_plan.chunks.items())
    return (
        f"{chunk_plan.operator}: chunks {chunks}; predicted peak per task "
        f"{format_bytes(chunk_plan.predicted_peak_bytes)} "
        f"of {format_bytes(chunk_plan.budget.per_task)}"
    )

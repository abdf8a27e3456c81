"""Plan and apply operators on xarray objects: the functions behind the ``.memchunk`` accessor."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import dask
import numpy as np
import xarray as xr

from . import memory_limits
from .baselines import (
    first_run_rises,
    held_after_running,
    held_in_chunk_caches,
    held_in_shared_production,
    without_loaded_runtime,
)
from .clusters import active_client, cluster_facts, scheduler_queueing, task_overhead_seconds
from .errors import (
    BudgetError,
    CalibrationError,
    DimensionError,
    InfeasiblePlanError,
    MemchunkError,
    MemoryBudgetWarning,
)
from .gathering import warn_when_gathered
from .measure.first_runs import FirstRuns
from .measure.runs import Run, RunReport, record_run
from .measure.runs import report as _report_run
from .measure.self_calibration import self_calibrate
from .memory_limits import Budget, resolve_budget
from .models import Calibration, load_calibration
from .models.learned import Learned, load_learned, settle_observations
from .operators import Operator, get_operator
from .operators.cost import TaskCost, bind_cost, produced_input, resolve_cost
from .operators.halo_rule import check_halo_reads
from .operators.kept_variables import KeptVariable, size_kept_variables
from .operators.production import explain_productions
from .operators.read_once import file_read_seconds, staged_if_faster
from .operators.registry import is_builtin
from .operators.sources import (
    chunk_in_memory,
    device_of,
    in_memory_data,
    input_kind,
    read_chunked,
    read_through_dask,
    storage_chunks,
)
from .operators.staged_plan import as_stored, plan_staged, write_task_bytes
from .operators.staging import StagingChunks, StagingSite, stage
from .operators.user_chunks import Chunks, normalize_user_chunks
from .planning.budget import format_size
from .planning.footprint import InputKind
from .planning.plan import ChunkPlan
from .planning.problem import DEFAULT_MAX_TASKS, PlanProblem
from .planning.roles import merge_dims
from .planning.search import plan_chunks, plan_for_chunks
from .refusals import checked_minimum, minimum_first, refusal_for_no_room
from .units import format_seconds

__all__ = ["MEASURE_CHOICES", "Plan", "apply", "plan", "report", "storage_chunks"]

#: What ``measure=`` takes: what planning may run to plan (see :func:`plan`).
MEASURE_CHOICES = ("auto", "never")
#: Plans of at most this many tasks per thread get a note where the scheduler queues tasks
#: on workers before they ask (:func:`_queue_depth_note`): one task's wait is then a
#: noticeable share of the run.
QUEUE_NOTE_WAVES = 8


class Plan:
    """A plan for one object and operator that runs itself: :meth:`apply`, then :meth:`report`.

    :func:`plan` (``obj.memchunk.plan``) returns it. It holds what planning resolved (the
    operator and its arguments, each variable's memory cost, the :class:`ChunkPlan`, where data
    is staged) and the object it was planned for: :meth:`apply` runs this plan, without planning
    again, and :meth:`report` compares the run with it. Every attribute and method of
    :class:`ChunkPlan` reads through: ``plan.chunks``, ``plan.dask_chunks``,
    ``plan.predicted_peak_bytes``, ``plan.budget``, ``plan.binding``, ``plan.notes``,
    ``plan.fits``, ``plan.explain()``...

    Parameters
    ----------
    obj
        The Dataset or DataArray planned for.
    prepared
        What planning resolved for it (made by :func:`plan`: not built by hand).
    measure
        What planning was allowed to run.

    Attributes
    ----------
    chunk_plan
        The :class:`ChunkPlan`: chunks, predicted peak per task, budget, and why.
    obj
        The Dataset or DataArray it was planned for.
    measure
        What planning was allowed to run, ``"auto"`` or ``"never"``.
    runs
        Each :meth:`apply` on a ``distributed`` cluster, newest last
        (:class:`~xarray_memchunk.measure.runs.Run`: when its graph was built, its layers, its
        client held weakly).

    Examples
    --------
    >>> plan = ds.memchunk.plan("gst3d")      # doctest: +SKIP
    >>> dip = plan.apply()                    # doctest: +SKIP
    >>> dip.compute()                         # doctest: +SKIP
    >>> print(plan.report())                  # doctest: +SKIP

    Two plans are equal when their :class:`ChunkPlan` are (as plans were before they ran
    themselves). A plan pickles as its :class:`ChunkPlan` (chunks, prediction, budget, notes):
    the operator and the data it holds stay in this process.
    """

    def __init__(
        self, obj: xr.DataArray | xr.Dataset, prepared: _Prepared, measure: str = "auto"
    ) -> None:
        # a shallow copy: what the plan was made for, even if the user's Dataset is changed in
        # place later (ds["t"] = ...); the data themselves are shared, not copied
        self._obj = obj.copy(deep=False)
        self._prepared = prepared
        self.measure = measure
        self.runs: list[Run] = []
        self._applied = False  # apply() was called, on a cluster or not
        self._staged: dict[str, xr.DataArray] = {}  # written once, read by every apply

    @property
    def chunk_plan(self) -> ChunkPlan:
        """The :class:`ChunkPlan` this plan runs."""
        return self._prepared.plan

    @property
    def obj(self) -> xr.DataArray | xr.Dataset:
        """The Dataset or DataArray this plan was made for."""
        return self._obj

    @property
    def staging_task_bytes(self) -> float:
        """Bytes a task writing the staged data holds at its peak; 0 where nothing is staged.

        Staging runs before the operator's tasks and is held to the same per-task budget: a
        worker's peak is the larger of the two phases (``predicted_peak_bytes`` is the
        operator's).
        """
        prepared = self._prepared
        return max(
            (
                write_task_bytes(
                    prepared.costs[name],
                    prepared.staging_chunks.get(name) or as_stored(prepared.costs[name]),
                )
                for name in prepared.staged
            ),
            default=0.0,
        )

    def __getattr__(self, name: str) -> Any:
        """The :class:`ChunkPlan`'s attributes and methods (called for what Plan lacks)."""
        prepared = self.__dict__.get("_prepared")
        if prepared is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(prepared.plan, name)

    def __dir__(self) -> list[str]:
        prepared = self.__dict__.get("_prepared")
        extra = dir(prepared.plan) if prepared is not None else []
        return sorted({*super().__dir__(), *(n for n in extra if not n.startswith("__"))})

    def __repr__(self) -> str:
        chunk_plan = self.chunk_plan
        return type(self).__name__ + repr(chunk_plan).removeprefix(type(chunk_plan).__name__)

    def __str__(self) -> str:
        return self.chunk_plan.explain()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Plan):
            return self.chunk_plan == other.chunk_plan
        return self.chunk_plan == other if isinstance(other, ChunkPlan) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.chunk_plan)

    def __reduce__(self) -> tuple[Any, tuple[ChunkPlan]]:
        """Pickled as its :class:`ChunkPlan`: the operator's costs and the data are not sent."""
        return (_as_chunk_plan, (self.chunk_plan,))

    def apply(self, *, record_plan: bool = False) -> xr.DataArray | xr.Dataset:
        """Rechunk the object per this plan and return the operator's lazy result.

        Nothing is planned again, and nothing is computed. On a ``distributed`` cluster the run
        is kept in :attr:`runs` (and its tasks are measured) for :meth:`report`. Where the
        result is too large to gather into one worker (or, with no cluster, into this process,
        whose finished pieces wait beside the tasks still running), as ``.compute()`` does,
        computing it so gives a :class:`~xarray_memchunk.ResultGatherWarning` (write it
        instead: ``result.memchunk.to_zarr`` gives none).

        Parameters
        ----------
        record_plan
            Add the plan's one-line summary to the result's attributes as ``memchunk_plan``
            (``memchunk run`` does, so that a written file says how it was computed).

        Returns
        -------
        xarray.DataArray or xarray.Dataset
            See :func:`apply`.
        """
        prepared = self._prepared
        rechunked = _rechunk(self._obj, prepared, self._staged)
        operator, kwargs = prepared.operator, prepared.kwargs
        uses = {name: cost.uses for name, cost in prepared.costs.items()}
        if isinstance(rechunked, xr.DataArray):
            (own,) = uses.values()
            result = operator.compute(rechunked, own, **kwargs)
        else:
            result = operator.compute_dataset(rechunked, uses, **kwargs)
            if operator.keeps_unplanned_variables:  # xarray's own methods: as xarray keeps them
                result = _with_untouched_coords(result, rechunked)
        check_halo_reads(result, rechunked, uses, operator.name)
        if isinstance(result, xr.DataArray) and result.name is None:
            result = result.rename(operator.name)
        if record_plan:
            result.attrs["memchunk_plan"] = _plan_summary(prepared.plan)
        run = record_run(rechunked, result, prepared.kept)
        self._applied = True
        plan = prepared.plan
        # the slots' peak as planned: chunks given over the budget have a warning of their own
        slot = min(plan.predicted_peak_bytes, plan.budget.per_task)
        running = slot * plan.budget.threads_per_worker
        gather = plan.budget.gather_advice(
            *_gathered(result), running=running, pieces=_dask_bytes(result)
        )
        if run is not None:
            self.runs.append(run)
            _RESULTS.remember(result, prepared, run)  # what reporting needs: not the data
            run.gather = gather
        if gather:  # with no cluster too: this process gathers the pieces as they finish
            warn_when_gathered(result, gather)
        return result

    def report(self, learn: bool = True) -> RunReport:
        """Predicted against measured for this plan's last run (:meth:`apply`, then compute).

        Parameters
        ----------
        learn
            Grow the operator's calibration where the run exceeded the prediction (or memory
            killed a worker running one of its tasks).

        Returns
        -------
        RunReport

        Raises
        ------
        MemchunkError
            When this plan was not applied on a ``distributed`` cluster, or its client is gone.
        """
        if not self.runs and self._applied:
            raise MemchunkError(
                f"this {self.chunk_plan.operator!r} plan was applied with no distributed "
                f"cluster (Dask's threads in this process), where its tasks are not measured: "
                f"start one first (client = dask.distributed.Client(LocalCluster(...))), then "
                f"plan.apply(), compute the result, and report"
            )
        if not self.runs:
            raise MemchunkError(
                f"no run of this {self.chunk_plan.operator!r} plan to report: run it with "
                f"plan.apply() on a distributed cluster and compute the result first "
                f"(obj.memchunk.apply() and xm.apply() make a plan of their own: report on "
                f"their result with xm.report(result))"
            )
        return _report_run(self.runs[-1], self._prepared, learn)


class _ResultPlans:
    """The plan and run of each result :meth:`Plan.apply` returned, while that result lives.

    Keyed by the result object itself, held weakly: no result is kept alive, two results never
    share an entry, and an entry goes with its result. A plan holds its runs' clients weakly,
    so no client is kept alive here either.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, _Prepared, Run]] = {}

    def remember(self, result: Any, prepared: _Prepared, run: Run) -> None:
        key = id(result)

        def forget(ref: weakref.ref) -> None:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]

        self._entries[key] = (weakref.ref(result, forget), prepared, run)

    def find(self, result: Any) -> tuple[_Prepared, Run] | None:
        entry = self._entries.get(id(result))
        if entry is None or entry[0]() is not result:
            return None
        return entry[1], entry[2]


_RESULTS = _ResultPlans()


def _as_chunk_plan(chunk_plan: ChunkPlan) -> ChunkPlan:
    """What an unpickled :class:`Plan` is: its :class:`ChunkPlan`."""
    return chunk_plan


def report(result: xr.DataArray | xr.Dataset, learn: bool = True) -> RunReport:
    """Predicted against measured for the run that computed ``result``, a result of ``apply``.

    For a caller who holds the result only (``xm.apply(...)``, ``obj.memchunk.apply(...)``):
    the same as ``plan.report()`` for the plan and the run that made ``result``.

    Parameters
    ----------
    result
        The object :func:`apply` or :meth:`Plan.apply` returned (not one made from it, such as
        its ``.compute()`` or a selection).
    learn
        As in :meth:`Plan.report`.

    Raises
    ------
    MemchunkError
        When ``result`` is not a result of ``apply``, or was not built on a ``distributed``
        cluster, or that cluster's client is gone.
    """
    found = _RESULTS.find(result)
    if found is None:
        raise MemchunkError(
            "this object is not a result of memchunk's apply on a distributed cluster (a result "
            "built without one has no run to report; a new object made from one, by .compute(), "
            "a selection or arithmetic, is not one): report with the result apply returned, or "
            "keep the plan: plan = xm.plan(obj, op); result = plan.apply(); ...; plan.report()"
        )
    prepared, run = found
    return _report_run(run, prepared, learn)


@dataclass(frozen=True)
class _Prepared:
    operator: Operator
    kwargs: dict[str, Any]
    costs: dict[str, TaskCost]  # variable name -> its resolved cost
    plan: ChunkPlan
    problem: PlanProblem  # what the plan was made from (a staged plan's: reading the store)
    staged: tuple[str, ...] = ()  # variables written to a temporary store before the run
    staging: StagingSite | None = None
    # variable name -> the chunks its store is written in
    staging_chunks: Mapping[str, StagingChunks] = dataclasses.field(default_factory=dict)
    # a Dataset's variables the operator keeps unplanned: xarray's tasks on them, sized
    kept: Mapping[str, KeptVariable] = dataclasses.field(default_factory=dict)


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


def _measured_for_less(known: Calibration | None, per_task: int, elements: int) -> str:
    """Why a self-calibration is measured again: its blocks stopped at a smaller budget; or "".

    A self-calibration stops growing its blocks where the next would need more than the
    per-task budget of the plan that ran it, and plans stay within twice the largest block: a
    plan refused under a small ``memory_limit``, then made under a larger one, would be held
    to the first plan's range. It is measured again where this plan's budget holds the block
    that stopped it (its peak recorded as ``next_block_peak_bytes``), and this plan's array
    (``elements``) is larger than the largest block measured: a smaller array's blocks would
    narrow the range, not widen it.
    """
    stopped = known.metadata.get("fit", {}).get("next_block_peak_bytes") if known else None
    if stopped is None or per_task < stopped:
        return ""
    largest = max((math.prod(p["extents"].values()) for p in known.profiles), default=0)
    if elements <= largest:
        return ""
    return (
        f"its calibration stopped growing blocks where the next needed "
        f"{format_size(stopped)}, over the per-task budget it was measured for: measured "
        f"again on larger blocks for this plan's {format_size(per_task)}"
    )


def _measured_on_a_smaller_array(known: Calibration | None, elements: int) -> str:
    """Why a self-calibration is measured again: it measured a smaller array whole; or "".

    Its blocks grew to the whole of the array it was measured for (a first plan of a small
    example, say), and plans stay within twice the largest: this plan's array (``elements``)
    is larger than that range, and would be held to tasks no larger than the example.
    """
    fit = known.metadata.get("fit", {}) if known else {}
    measured, trusted = fit.get("whole_array_elements"), fit.get("max_task_elements")
    if measured is None or trusted is None or elements <= trusted:
        return ""
    return (
        f"its calibration measured a smaller array whole ({int(measured):,} elements; plans "
        f"reach {int(trusted):,}): measured again on this array's blocks ({elements:,} "
        f"elements)"
    )


def _cost(
    operator: Operator,
    name: str,
    da: xr.DataArray,
    kwargs: dict[str, Any],
    device: str,
    budget: Budget,
    notes: list[str],
    measure: str = "auto",
) -> TaskCost:
    """Resolve one variable's cost, measuring the operator first where nothing else is known.

    A self-calibrating operator without a calibration is measured in a worker
    (:func:`~xarray_memchunk.measure.self_calibration.self_calibrate`), and so is a NumPy
    function whose last run says its model is wrong (:attr:`Learned.asks_for_measuring`: memory
    killed a worker running its task, or a task needed more than twice its prediction), and so
    is a self-calibrating operator whose blocks stopped growing at a smaller budget than this
    plan's (:func:`_measured_for_less`) or at the whole of a smaller array
    (:func:`_measured_on_a_smaller_array`). The plan's notes say so. With ``measure="never"``
    nothing is measured: the first is refused, the second planned with its model raised as
    runs taught (x2 at most per run), the third with the range it has.

    Raises
    ------
    CalibrationError
        With ``measure="never"``, for an operator that has no memory model it can be sure of.
    """
    uses, cost = bind_cost(operator, da, kwargs)  # a refused dtype or missing dims said first
    key, dtype = cost.calibration_key, np.dtype(da.dtype).name
    known = load_calibration(key, device, dtype)
    learned = load_learned(key, device, dtype)
    wrong = learned is not None and learned.asks_for_measuring
    measurable, doubt = cost.measurable, cost.identity_doubt  # a NumPy function
    calibrates_itself = measurable and cost.model is None
    unknown = known is None or bool(doubt)
    narrow = (
        _measured_for_less(known, budget.per_task, da.size)
        or _measured_on_a_smaller_array(known, da.size)
        if calibrates_itself and not unknown and measure != "never"
        else ""
    )
    if measure == "never" and calibrates_itself and unknown:
        raise CalibrationError(_no_model(operator, device, dtype, doubt))
    if doubt and measure != "never":  # a cached model may be another function's: measured now
        notes.append(f"the identity of {operator.name!r} is not certain ({doubt}): measured now")
    if measure == "never" and wrong:
        pass  # not measured again: planned with the model raised, as the note below says
    elif (calibrates_itself and (unknown or narrow)) or (measurable and wrong):
        if device != "cpu":
            raise CalibrationError(
                f"operator {operator.name!r} calibrates itself on the CPU only; give it a "
                f"memory_model for CuPy data"
            )
        if wrong:
            notes.append(f"{_found_wrong(operator, learned)}: measured again now")
        elif narrow:
            notes.append(narrow)
        # the input's production is measured here while the measuring process starts
        measured = self_calibrate(
            operator, da, kwargs, budget.per_task, meanwhile=lambda: produced_input(da)
        )
        notes.append(measured.explain())
        if wrong and (unsettled := settle_observations(key, device, dtype)):
            notes.append(unsettled)
    if wrong and (measure == "never" or not measurable):
        how = (
            "plan with measure='auto'"  # a user's function: the command line cannot import it
            if calibrates_itself and measure == "never"
            else f"`memchunk calibrate {operator.name}`"
        )
        notes.append(
            f"{_found_wrong(operator, learned)}: planned with the model raised x2 at most; "
            f"measure it on this machine with {how}"
        )
    return resolve_cost(operator, name, da, uses, cost, device)


def _no_model(operator: Operator, device: str, dtype: str, doubt: str) -> str:
    """Why ``measure="never"`` cannot plan a function without a memory model, and what to do."""
    if doubt:
        why = f"the calibration saved for it may be another function's ({doubt})"
        first = "give it a memory_model"
    else:
        why = f"no calibration of it is saved for {dtype} data on the {device.upper()}"
        first = f"measure it first with xm.calibrate(op, dtypes=[{dtype!r}]), or give it a model"
    return (
        f"operator {operator.name!r} has no memory model: it was given no memory_model, and "
        f"{why}. measure='never' runs nothing, so it cannot be measured while planning: pass "
        f"measure='auto' to measure it on a few blocks now, or {first}"
    )


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
    measure: str = "auto",
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
        kwargs = operator.check_arguments(kwargs, obj)
        cost = _cost(operator, name, obj, kwargs, device, budget, notes, measure)
        return {name: obj}, {name: cost}, {}, kwargs
    if not obj.data_vars:
        raise MemchunkError("the Dataset has no data variables to apply the operator to")
    variables, costs, errors, bound = {}, {}, {}, None
    for key, da in obj.data_vars.items():
        name = str(key)
        try:
            own = operator.check_arguments(kwargs, da)
        except (CalibrationError, InfeasiblePlanError):
            raise
        except MemchunkError as exc:
            errors[name] = (da, exc)
            continue
        if not isinstance(key, str):  # plans, notes and results are keyed by the name
            raise MemchunkError(
                f"variable {key!r} of the Dataset is not named by a string (its name is of "
                f"type {type(key).__name__}), and memchunk keys its plan by variable name: "
                f"rename it first, e.g. ds.rename_vars({{{key!r}: {str(key)!r}}})"
            )
        try:  # a variable refused above is never measured
            costs[name] = _cost(operator, name, da, own, device, budget, notes, measure)
        except (CalibrationError, InfeasiblePlanError):  # a broken file or measurement, or a
            raise  # way of computing that cannot suit this variable: not the variable's fault
        except MemchunkError as exc:
            errors[name] = (da, exc)
            continue
        variables[name], bound = da, bound or own
    if not variables:
        first = next(iter(errors.values()))[1]
        raise type(first)(
            f"no variable of the Dataset suits operator {operator.name!r}: "
            + "; ".join(f"{name}: {exc}" for name, (_, exc) in errors.items())
        )
    # told with the arguments bound to a planned variable (a groupby's dim, found from by=)
    left_out = {name: operator.skipped(da, str(exc), **bound) for name, (da, exc) in errors.items()}
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
    measure: str = "auto",
) -> _Prepared:
    """Plan the first of the operator's alternatives that fits the budget (or the fastest).

    With user ``chunks`` an alternative fits when those chunks are predicted to; when none
    does, the one with the smallest predicted peak is taken and a
    :class:`MemoryBudgetWarning` says so. Warnings are issued for the chosen one only. Staging
    a graph's data on disk is the last resort: tried only where no alternative fits in memory.
    ``measure``: what planning may run (see :func:`plan`).
    """
    _check_measure(measure)
    operator = get_operator(op)
    if not isinstance(obj, xr.DataArray | xr.Dataset):
        raise MemchunkError(
            f"memchunk works on xarray Dataset and DataArray objects, not {type(obj).__name__}"
        )
    _check_dims(obj, operator.name)
    device = _device(obj, operator)

    def replan(at: Budget, measuring: str) -> _Prepared:
        return _prepare(obj, operator, None, at, chunks, op_kwargs, measuring)

    try:
        resolved = _budget(memory_limit, budget, device)
    except BudgetError as no_room:
        raise refusal_for_no_room(no_room, operator, replan, measure) from None
    alternatives = operator.alternatives(operator.check_arguments(op_kwargs))
    try:
        chosen, failures = _choose(obj, operator, resolved, device, alternatives, chunks, measure)
    except InfeasiblePlanError as refused:
        checked = checked_minimum(refused, resolved, operator, replan, measure)
        raise minimum_first(checked, resolved, operator) from None
    label, prepared, cautions = chosen
    for caution in cautions:
        warnings.warn(caution, MemoryBudgetWarning, stacklevel=4)
    notes = prepared.plan.notes
    if len(alternatives) > 1:
        why = [f"{label} chosen"] + [f"not {w}: {r}" for w, r in failures if w != label]
        notes = (*notes, "; ".join(why))
    if measure == "never":
        notes = (*notes, _nothing_measured(prepared))
    notes = (*notes, *_queue_depth_note(prepared.plan, len(prepared.costs)))
    if len(prepared.costs) > 1:  # the tasks row counts one variable's
        notes = (*notes, _tasks_in_all(prepared.plan, prepared.costs))
    kept = _kept(obj, prepared)
    budget = prepared.plan.budget
    notes = (*notes, *(k.note(budget) for k in kept.values() if k.worth_noting(budget)))
    return replace(prepared, plan=replace(prepared.plan, notes=notes), kept=kept)


def no_room_refusal_for(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    no_room: BudgetError,
    *,
    measure: str = "auto",
    **op_kwargs: Any,
) -> BudgetError:
    """The refusal :func:`plan` gives where a worker's memory has no room for one task.

    ``no_room``: what building the budget raised (a budget made by hand, as ``memchunk run``
    makes the one of the cluster it will start). Its minimum is only room for a task; the
    refusal states the least memory the operator's plan runs at, as :func:`plan` does with a
    ``memory_limit``: a new user's ``memchunk run gst3d ... --memory-limit 250MB`` was told
    "at least 238.42 MiB", the limit it had just refused, and then 429.87 MiB there.
    """
    operator = get_operator(op)

    def replan(at: Budget, measuring: str) -> _Prepared:
        return _prepare(obj, operator, None, at, None, op_kwargs, measuring)

    return refusal_for_no_room(no_room, operator, replan, measure)


def _tasks_in_all(plan: ChunkPlan, costs: Mapping[str, TaskCost]) -> str:
    """The note on a Dataset's operator tasks: a task per chunk of each planned variable.

    Each variable's chunks are those of its own dims. A new user's plan of 4 variables under
    ``memchunk.max-tasks`` 50 said "tasks 12", bound by the cap, and the graph had 48.
    """
    tasks = sum(
        math.prod(len(plan.dask_chunks[d]) for d in cost.dims if d in plan.dask_chunks)
        for cost in costs.values()
    )
    return (
        f"{tasks:,} operator tasks in all: a task per chunk of each of the {len(costs)} planned "
        f"variables (the dask config key memchunk.max-tasks counts {plan.n_chunks:,} per "
        f"variable)"
    )


def _kept(obj: xr.DataArray | xr.Dataset, prepared: _Prepared) -> dict[str, KeptVariable]:
    """The Dataset's variables the plan's operator keeps unplanned, their tasks sized."""
    if isinstance(obj, xr.DataArray):
        return {}
    uses = {name: cost.uses for name, cost in prepared.costs.items()}
    return size_kept_variables(obj, prepared.operator, uses, prepared.kwargs, prepared.plan.budget)


def _queue_depth_note(plan: ChunkPlan, n_variables: int) -> tuple[str, ...]:
    """A note where the cluster's scheduler commits tasks to workers before they ask.

    At ``worker-saturation`` above 1 (distributed's default, 1.1), a worker is sent a root task
    beyond its threads, queued behind one that runs. Where a plan is a few tasks per thread,
    the last may wait there while another worker idles: the median's 6 tasks of 0.45-0.53 s
    split 4/2 on 2 workers of 1 thread in 2 of 2 runs (1.95 s, against 1.48-1.64 s at 1.0).
    The scheduler queues a task group only where it has more than twice the cluster's threads
    (``Scheduler.is_rootish``), so plans of at most 2 tasks per thread get no note, nor do
    plans of more than :data:`QUEUE_NOTE_WAVES`. At ``inf`` nothing is queued: every task is
    sent at once, as before distributed 2022.11, and the note is not this one.
    """
    client = active_client()
    if client is None:
        return ()
    asked = scheduler_queueing(client)
    if asked is None:
        return ()
    saturation, threads = asked
    if threads < 1 or saturation <= 1.0 or math.isinf(saturation):
        return ()
    waves = plan.n_chunks * n_variables / threads
    if not 2 < waves <= QUEUE_NOTE_WAVES:
        return ()
    return (
        f"the scheduler sends a worker tasks beyond its threads (worker-saturation "
        f"{saturation:g}): with {waves:.1f} tasks per thread, the last may wait behind another "
        f"while a worker idles; distributed.scheduler.worker-saturation: 1.0, set before the "
        f"cluster starts, sends each its next task when it asks",
    )


def _choose(
    obj: xr.DataArray | xr.Dataset,
    operator: Operator,
    resolved: Budget,
    device: str,
    alternatives: list[tuple[str, dict[str, Any] | None, str]],
    chunks: Chunks,
    measure: str,
) -> tuple[tuple[str, _Prepared, list[str]], list[tuple[str, str]]]:
    """The first alternative that fits (in memory, else staged), and why the others were not.

    For an operator that :attr:`~xarray_memchunk.Operator.chooses_fastest`, every alternative
    is planned, and the one estimated fastest among those that fit is taken. Each alternative
    is resolved (and measured) once for both passes. Where none fits and user ``chunks`` gave
    plans over the budget, the one with the smallest predicted peak.

    Returns
    -------
    tuple
        ``((label, prepared, cautions), failures)``: the chosen alternative, its plan and the
        warnings it issues; ``(label, why)`` of each alternative not taken in the last pass.

    Raises
    ------
    InfeasiblePlanError
        When no alternative has a plan: the one's reason, or each alternative's.
    """
    chosen = None
    resolutions: dict[int, _Alternative] = {}  # resolved (and measured) once for both passes
    for staging in (False, True):
        failures: list[tuple[str, str]] = []  # (alternative, why it was not taken)
        refusals: list[InfeasiblePlanError] = []
        over_budget: list[tuple[str, _Prepared, list[str]]] = []
        fitting: list[tuple[str, _Prepared, list[str]]] = []
        for index, (label, kwargs, reason) in enumerate(alternatives):
            if kwargs is None:
                failures.append((label, reason))
                continue
            try:
                if index not in resolutions:
                    resolutions[index] = _alternative(
                        obj, operator, resolved, device, kwargs, measure
                    )
                prepared, cautions = _prepare_one(
                    operator, resolved, chunks, resolutions[index], staging=staging, measure=measure
                )
            except InfeasiblePlanError as exc:
                failures.append((label, str(exc)))
                refusals.append(exc)
                continue
            if prepared.plan.fits:
                fitting.append((label, prepared, cautions))
                if not operator.chooses_fastest:
                    break
                continue
            over_budget.append((label, prepared, cautions))
            peak = resolved.format(prepared.plan.predicted_peak_bytes)
            failures.append((label, f"the given chunks are predicted to need {peak} per task"))
        if fitting:
            chosen = min(fitting, key=lambda c: c[1].plan.estimated_seconds)
            failures += [
                _slower(label, p, chosen[1]) for label, p, _ in fitting if p is not chosen[1]
            ]
        if chosen is not None or over_budget:
            break
    if chosen is None:
        if not over_budget:
            if len(alternatives) == 1 and len(refusals) == 1:
                raise refusals[0]
            limits = [e.minimum_memory_limit for e in refusals if e.minimum_memory_limit]
            raise InfeasiblePlanError(
                "; ".join(f"{what}: {why}" for what, why in failures),
                # an alternative runs at its own minimum: the least of those stated (one that
                # states none runs at no memory, and the others' still hold)
                minimum_memory_limit=min(limits, default=None),
            )
        chosen = min(over_budget, key=lambda c: c[1].plan.predicted_peak_bytes)
    return chosen, failures


def _slower(label: str, prepared: _Prepared, chosen: _Prepared) -> tuple[str, str]:
    """Why a fitting alternative was not taken: its estimated time against the chosen one's."""
    mine, theirs = prepared.plan.estimated_seconds, chosen.plan.estimated_seconds
    ratio = mine / max(theirs, 1e-12)
    return label, (
        f"fits too, but is estimated {ratio:.2f}x as long ({format_seconds(mine)} against "
        f"{format_seconds(theirs)}: estimates that rank chunkings, not forecasts)"
    )


def _check_measure(measure: Any) -> None:
    """Refuse a ``measure=`` that is not one of :data:`MEASURE_CHOICES`, before anything runs."""
    if not isinstance(measure, str) or measure not in MEASURE_CHOICES:
        raise MemchunkError(
            f"measure={measure!r} is not one of {', '.join(map(repr, MEASURE_CHOICES))}: 'auto' "
            f"measures what planning needs and nothing else knows (a function without a memory "
            f"model, one block of a graph's input, the staging disk), 'never' runs nothing"
        )


def _measuring(measure: str) -> contextlib.AbstractContextManager:
    """Where ``measure="never"``, the input's production is not measured while resolving costs.

    :func:`~xarray_memchunk.operators.production.input_production` reads the dask config key
    ``memchunk.measure-input``; ``"auto"`` leaves it as the user set it.
    """
    if measure == "never":
        return dask.config.set({"memchunk.measure-input": False})
    return contextlib.nullcontext()


def _nothing_measured(prepared: _Prepared) -> str:
    """The note of a plan made with ``measure="never"``."""
    note = (
        "measure='never': nothing was run to plan this: no function measured, no block of the "
        "input computed (what producing a graph's input holds is not in the prediction)"
    )
    if prepared.staging is not None:
        note += ", the staging disk's speed not measured"
    return note


@dataclass(frozen=True)
class _Alternative:
    """One way of running the operator, resolved: its variables, their costs, its problem."""

    kwargs: dict[str, Any]  # bound to the variables (CF names resolved)
    targets: dict[str, xr.DataArray]
    costs: dict[str, TaskCost]
    problem: PlanProblem
    first_runs: dict[str, FirstRuns] = field(default_factory=dict)  # first_run_rises


def _max_tasks() -> int:
    """The dask config key ``memchunk.max-tasks``: most chunks a chosen plan may have."""
    value = dask.config.get("memchunk.max-tasks", DEFAULT_MAX_TASKS)
    whole = isinstance(value, int | float) and not isinstance(value, bool)
    if not whole or not math.isfinite(value) or value != int(value) or value < 1:
        raise MemchunkError(
            f"the dask config key memchunk.max-tasks must be a whole number of at least 1 "
            f"(the most chunks a plan may have; 1e6 is one), not {value!r}"
        )
    return int(value)


def _alternative(
    obj: xr.DataArray | xr.Dataset,
    operator: Operator,
    resolved: Budget,
    device: str,
    kwargs: dict[str, Any],
    measure: str = "auto",
) -> _Alternative:
    """Resolve one alternative's variables and costs (measuring what must be) and its problem."""
    fresh: list[str] = []
    with _measuring(measure):
        targets, costs, skipped, kwargs = _resolve(
            obj, operator, kwargs, device, resolved, fresh, measure
        )
    specs = merge_dims(
        [(c.dims, c.sizes, c.uses, storage_chunks(targets[n])) for n, c in costs.items()]
    )
    empty = [s.name for s in specs if s.size == 0]  # no block of it was computed to measure
    if empty:
        raise DimensionError(
            f"dim {empty[0]!r} has length 0: there is nothing to compute; select a non-empty "
            f"range first"
        )
    problem = PlanProblem(
        operator=operator.name,
        dims=specs,
        peak_bytes=_peak_function(costs),
        work_terms=tuple((tuple(c.dims), c.seconds_per_element) for c in costs.values()),
        task_overhead_s=task_overhead_seconds() * max(c.tasks_per_chunk for c in costs.values()),
        combine_seconds_per_chunk=max(c.combine_seconds_per_chunk for c in costs.values()),
        notes=(*fresh, *_notes(costs, skipped)),
        inputs=tuple(c.layout for c in costs.values()),
        task_element_caps=tuple(
            (tuple(c.dims), c.max_task_elements) for c in costs.values() if c.max_task_elements
        ),
        max_extents=_max_extents(costs),
    )
    read = file_read_seconds(costs, targets) if measure != "never" else None
    if read is not None:  # a file's decoding, measured: what cutting its storage chunks costs
        problem = replace(problem, read_seconds_per_element=read)
    rises = first_run_rises(operator, targets, costs, kwargs, resolved, measure)
    return _Alternative(kwargs, targets, costs, problem, rises)


def _prepare_one(
    operator: Operator,
    resolved: Budget,
    chunks: Chunks,
    alternative: _Alternative,
    *,
    staging: bool = False,
    measure: str = "auto",
) -> tuple[_Prepared, list[str]]:
    """Plan one alternative; also return the warnings it would issue if chosen.

    ``staging``: where no plan fits in memory, try staging the graph's data on disk (its
    write speed measured unless ``measure="never"``).
    """
    kwargs, costs = alternative.kwargs, alternative.costs
    resolved = held_after_running(resolved, operator, costs, alternative.first_runs)
    resolved, problem = held_in_chunk_caches(
        resolved, operator, alternative.targets, costs, alternative.problem
    )
    problem = without_loaded_runtime(resolved, operator, problem)
    costs, problem = held_in_shared_production(resolved, costs, problem)
    problem = replace(problem, max_tasks=_max_tasks())
    if chunks is None:
        try:
            in_memory_plan = plan_chunks(problem, resolved)
        except InfeasiblePlanError as in_memory:
            if not staging:
                raise
            staged = plan_staged(costs, problem, resolved, in_memory, measure)
            prepared = _Prepared(
                operator,
                kwargs,
                costs,
                staged.plan,
                staged.problem,
                staged.variables,
                staged.site,
                staged.chunks,
            )
            return prepared, []
        if measure == "never":
            return _Prepared(operator, kwargs, costs, in_memory_plan, problem), []
        choice = staged_if_faster(costs, alternative.targets, in_memory_plan, problem, resolved)
        faster = choice.staged
        if faster is None:
            kept = in_memory_plan
            if choice.why_not:
                kept = replace(kept, notes=(*kept.notes, choice.why_not))
            return _Prepared(operator, kwargs, costs, kept, problem), []
        prepared = _Prepared(
            operator,
            kwargs,
            costs,
            faster.plan,
            faster.problem,
            faster.variables,
            faster.site,
            faster.chunks,
        )
        return prepared, []
    cautions: list[str] = []
    notes: list[str] = []
    user_chunks = normalize_user_chunks(chunks, alternative.targets, problem.dims, cautions, notes)
    problem = replace(problem, notes=(*problem.notes, *notes))
    chunk_plan = plan_for_chunks(problem, resolved, user_chunks)
    if not chunk_plan.fits:
        cautions.append(
            "the given chunks are predicted to need "
            f"{resolved.format(chunk_plan.predicted_peak_bytes)} per {operator.name!r} task, "
            f"over the per-task budget of {resolved.format(resolved.per_task)}: workers may "
            "pause or be killed. Leave chunks out to let memchunk choose."
        )
    return _Prepared(operator, kwargs, costs, chunk_plan, problem), cautions


def _max_extents(costs: Mapping[str, TaskCost]) -> dict[str, float]:
    """The smallest measured extent per dim over the variables, where a model has one."""
    caps: dict[str, float] = {}
    for cost in costs.values():
        for dim, cap in cost.max_extents.items():
            caps[dim] = min(cap, caps.get(dim, cap))
    return caps


def _model_sources(costs: Mapping[str, TaskCost]) -> str:
    """Where each variable's memory model comes from; by variable where they differ.

    A Dataset's float32 and float64 variables may share a calibration and differ only by what
    runs taught one of them: joined bare, the two read as one source repeated.
    """
    by_source: dict[str, list[str]] = {}
    for name, cost in costs.items():
        by_source.setdefault(cost.model_source, []).append(str(name))
    if len(by_source) == 1:
        return next(iter(by_source))
    return "; ".join(
        f"{', '.join(sorted(names))}: {source}" for source, names in sorted(by_source.items())
    )


def _notes(costs: Mapping[str, TaskCost], skipped: Mapping[str, str]) -> tuple[str, ...]:
    notes = [f"memory model: {_model_sources(costs)}"]
    produced = {str(n): c.production for n, c in costs.items() if c.production}
    if produced:
        notes.append(explain_productions(produced, format_size))
    kinds = {c.layout.kind for c in costs.values()}
    if InputKind.FILE in kinds:
        notes.append("input read straight from its file: each task reads its own block")
    ranges = {n: c.max_task_elements for n, c in costs.items() if c.max_task_elements}
    if ranges:
        each = (
            "; ".join(f"{n}'s {r:,.0f} elements" for n, r in ranges.items())
            if len(ranges) > 1
            else f"{next(iter(ranges.values())):,.0f} elements"
        )
        notes.append(
            f"memory model measured on tasks of up to {each} (by self-calibration): plans stay "
            f"within them"
        )
    caps = _max_extents(costs)
    if caps:
        notes.append(
            "memory grew faster than the block along "
            + ", ".join(f"{d!r} (measured up to {n:,.0f})" for d, n in caps.items())
            + ": the model is not extrapolated along them"
        )
    notes += [f"not planned: {name} ({reason})" for name, reason in skipped.items()]
    return tuple(notes)


def plan(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    memory_limit: int | str | None = None,
    budget: Budget | None = None,
    chunks: Chunks = None,
    measure: str = "auto",
    **op_kwargs: Any,
) -> Plan:
    """Plan chunks for ``op`` on ``obj``; the operator itself is not run on the data.

    Planning reads metadata, and with ``measure="auto"`` runs three things where nothing else
    tells it what it needs, each stated in the plan's notes when it happens: a user function
    without a memory model is measured on a few blocks of its own (in a worker of the active
    cluster, or a child process); one block of a Dask graph's input is computed in this
    process, twice, to measure what producing it holds (once per graph; the dask config key
    ``memchunk.measure-input: False`` turns this one off); and where the data must be staged
    on disk, the staging directory's write speed is measured (64 MiB written once per
    process). ``measure="never"`` runs none of them and the notes say so: a function without
    a memory model is refused (before anything runs), a graph's input is planned without
    what producing it holds, and the staging disk's speed is not measured.

    Parameters
    ----------
    obj
        A Dataset or DataArray, chunked or numpy-backed (planned as one chunk).
    op
        A registered operator name (see :func:`xarray_memchunk.operator_names`) or an
        :class:`~xarray_memchunk.operators.Operator`.
    memory_limit
        Memory limit of one worker (``"1.5GB"`` or bytes), as ``LocalCluster(memory_limit=...)``
        takes it; with no active ``distributed.Client``, that of this process, shared by Dask's
        threaded scheduler's threads; discovered from the active client, the dask config or
        this machine when None.
    budget
        A ready :class:`Budget` (per-task bytes and the cluster's layout), instead of
        ``memory_limit``.
    chunks
        Skip the search and plan for these chunks (as :meth:`xarray.Dataset.chunk` takes them);
        a :class:`MemoryBudgetWarning` is issued when their predicted peak exceeds the budget.
    measure
        What planning may run to measure what it needs: ``"auto"`` (the default) or
        ``"never"`` (see above; :data:`MEASURE_CHOICES`).
    **op_kwargs
        The operator's own arguments (``dim=``, ``sigma=``, ...).

    Returns
    -------
    Plan
        The plan, ready to run: ``plan.apply()`` returns the lazy result without planning
        again, and ``plan.report()`` compares a run on a ``distributed`` cluster with it. It
        reads as its :class:`ChunkPlan` (``plan.chunks``, ``plan.explain()``...).

    Raises
    ------
    MemchunkError
        Unknown operator, missing dims, invalid memory limit, a ``measure`` that is not one of
        the choices, a function without a memory model with ``measure="never"``
        (:class:`CalibrationError`), or no chunking that fits.
    """
    through_dask = read_through_dask(obj)  # a variable opened without chunks is not read whole
    here = _plans_this_process(memory_limit, budget)
    held = _memory_the_baseline_reads(here, budget)
    try:
        prepared = _prepare(through_dask, op, memory_limit, budget, chunks, op_kwargs, measure)
    except (BudgetError, InfeasiblePlanError):
        grown = 0 if held is None else (_memory_the_baseline_reads(here, budget) or 0) - held
        if grown <= memory_limits.PLANNING_GROWTH_BYTES:
            raise
        # once more, from what this process (or the workers) hold now: the minimum it states
        # then counts it
        prepared = _prepare(through_dask, op, memory_limit, budget, chunks, op_kwargs, measure)
    else:
        if held is not None and _grew_past_its_baseline(held, prepared.plan.budget, here):
            # planned from what this process (or the workers) held before planning grew it
            # (a function's sample run imports flox's kernels): once more, from what it holds now
            prepared = _prepare(through_dask, op, memory_limit, budget, chunks, op_kwargs, measure)
    return Plan(_planned_through_dask(obj, through_dask, prepared), prepared, measure)


def _memory_the_baseline_reads(here: bool, budget: Budget | None) -> int | None:
    """The memory a plan's baseline reads, now: planning may grow it.

    This process's where it is the budget (:func:`_plans_this_process`); else, with no budget
    given, the largest memory of the active client's workers, asked; None otherwise: no
    client, an asynchronous one, no worker yet (an adaptive cluster at zero), or workers in
    this process (their memory is this process's).
    """
    if here:
        return memory_limits.held_by_this_process()
    client = active_client()
    if budget is not None or client is None or getattr(client, "asynchronous", False):
        return None
    try:
        facts = cluster_facts(client, ask_above=0)
    except MemchunkError:  # no workers yet: nothing grew
        return None
    if facts.in_this_process or not facts.largest_process_memory:
        return None
    return facts.largest_process_memory


def _grew_past_its_baseline(held_before: int, planned: Budget, here: bool) -> bool:
    """Whether planning grew what the baseline reads past the baseline its plan counts.

    By more than :data:`~xarray_memchunk.memory_limits.PLANNING_GROWTH_BYTES`
    (:func:`_memory_the_baseline_reads`: ``held_before``, and now):
    - with no cluster, this process, which must also have grown by more than that since
      ``held_before``: a user's ``groupby`` function over ``open_mfdataset`` files, planned
      with no cluster at 411.54 MiB, counted the configured 190.73 MiB (this process held
      155.5 MiB), and its sample run left the process holding 219.3 MiB; the run peaked at
      360.4 MiB against a 329.23 MiB line;
    - on a cluster whose workers' memory the plan read (on the CPU), the largest worker: a
      groupby plan over a preprocessing graph on fresh workers tried ``method="map-reduce"``
      first, whose first run in each worker imported flox's numba kernels (94 MiB); the
      ``"blockwise"`` plan it chose still counted the workers' memory before that (198.55 MiB,
      where they held 240 MiB), and its run at the refusal's stated minimum peaked at 633 MiB
      against a 562 MiB pause line.
    """
    allowed = memory_limits.PLANNING_GROWTH_BYTES
    if here:
        now = memory_limits.held_by_this_process()
        if now - held_before <= allowed:
            return False
    elif planned.read_from_cluster and planned.device == "cpu":
        now = _memory_the_baseline_reads(here, None)
        if now is None:
            return False
    else:
        return False
    return now > planned.worker_baseline + allowed


def _plans_this_process(memory_limit: int | str | None, budget: Budget | None) -> bool:
    """Whether the plan's budget is this process's memory: ``memory_limit=``, no cluster.

    Its memory now is then the budget's baseline, and planning itself may raise it: a trial's
    median over ``open_mfdataset`` files was refused with "at least 276.01 MiB", and refused
    again there, as opening and measuring the files had left this process 224 MiB where it
    held less. A refusal is planned once more where this process grew by more than
    :data:`~xarray_memchunk.memory_limits.PLANNING_GROWTH_BYTES`, which its stated minimum
    allows.
    """
    return memory_limit is not None and budget is None and active_client() is None


def _planned_through_dask(
    obj: xr.DataArray | xr.Dataset, through_dask: xr.DataArray | xr.Dataset, prepared: _Prepared
) -> xr.DataArray | xr.Dataset:
    """``obj`` with the variables the plan reads as ``through_dask`` holds them.

    The variables it leaves out stay as they were: one read through Dask would be a single
    chunk of the whole variable, which no plan budgets.
    """
    if isinstance(obj, xr.DataArray) or through_dask is obj:
        return through_dask
    planned = {
        name: through_dask[name].variable
        for name in prepared.costs
        if through_dask[name].variable is not obj[name].variable
    }
    return obj.assign(planned) if planned else obj


def apply(
    obj: xr.DataArray | xr.Dataset,
    op: str | Operator,
    *,
    memory_limit: int | str | None = None,
    budget: Budget | None = None,
    chunks: Chunks = None,
    measure: str = "auto",
    record_plan: bool = False,
    **op_kwargs: Any,
) -> xr.DataArray | xr.Dataset:
    """Plan, then rechunk ``obj`` per the plan and return the operator's lazy result.

    ``plan(obj, op, ...).apply(record_plan=record_plan)``: takes the same arguments as
    :func:`plan`, and ``record_plan``: add the plan's one-line summary to the result's
    attributes as ``memchunk_plan`` (``memchunk run`` does, so that a written file says how it
    was computed). Keep the plan (:func:`plan`, then :meth:`Plan.apply`) to see it before the
    run and report on the run after; :func:`report` reports on a result of this function.
    Dataset in, Dataset out: the reductions keep or drop the variables they do not reduce as
    xarray's own do, the other operators leave them out. DataArray in, DataArray out, named
    after the operator when the input has no name. Nothing is computed: call ``.compute()`` on
    the result, or write it with ``result.memchunk.to_zarr(path)`` (or
    ``.memchunk.to_netcdf(path)``). Those make the planned chunks uniform, as Zarr requires,
    and write atomically. Plain ``result.to_zarr()`` fails on balanced chunks such as (17, 17,
    17, 17, 16, 16): Zarr wants every chunk of a dim but the last equal, and the last no larger
    (``plan.explain()`` says when the planned ones are not).
    """
    return plan(
        obj,
        op,
        memory_limit=memory_limit,
        budget=budget,
        chunks=chunks,
        measure=measure,
        **op_kwargs,
    ).apply(record_plan=record_plan)


def _rechunk(obj, prepared: _Prepared, staged: dict[str, xr.DataArray]):
    """Bring each planned variable to the planned chunks, in the way that holds least.

    ``staged``: the variables already staged by an earlier apply of the same plan (read again,
    not written again); those staged now are added to it.

    - Read straight from a file: the tasks read the planned chunks from the file (halos are
      read by the operator itself), so no chunk waits in a worker for other tasks.
    - Produced by a Dask graph that the plan stages on disk (a rechunk in memory would not
      fit): written to a temporary Zarr store now, in chunks chosen for the plan
      (:func:`~xarray_memchunk.operators.staging.stage`), then read as a file is.
    - Produced by a Dask graph: a task-based rechunk, its intermediate blocks capped at the
      planned chunk's bytes (``array.chunk-size``). Dask's P2P rechunk (chosen for large
      rechunks on a distributed cluster) holds memory outside tasks that no model here
      predicts: ``benchmarks/p2p_rechunk.py`` measured 1.01-1.09 GB per worker whatever its
      comm buffer, and killed 1 GB workers where the staged plan completed.
    - NumPy (or CuPy) data: cut into the planned chunks, read-only views of it for a built-in
      operator, copies for a user's function, which may write into its block
      (:func:`~xarray_memchunk.operators.sources.chunk_in_memory`: no copy of the whole
      array, no hash). A file variable read without Dask is chunked as xarray chunks it.
    """
    chunks = prepared.plan.dask_chunks
    planned = {}
    for name, cost in prepared.costs.items():
        da = obj if isinstance(obj, xr.DataArray) else obj[name]
        own = {d: chunks[d] for d in cost.dims}
        if name in prepared.staged:
            if name not in staged:
                staged[name] = stage(da, prepared.staging, prepared.staging_chunks.get(name))
            da = staged[name]
        if cost.layout.kind is InputKind.FILE or name in prepared.staged:
            planned[name] = read_chunked(da, own)
            continue
        if cost.layout.kind is InputKind.MEMORY and in_memory_data(da):
            planned[name] = chunk_in_memory(da, own, copy=not is_builtin(prepared.operator))
            continue
        chunk_bytes = cost.dtype.itemsize * int(np.prod([max(c) for c in own.values()]))
        planned[name] = _rechunked_in_graph(da, own, chunk_bytes)
    if isinstance(obj, xr.DataArray):
        return next(iter(planned.values()))
    # the other variables stay as they are (the operator decides what to keep of them), but
    # where xarray's tasks on a kept one would not fit as it is chunked
    for name, kept in prepared.kept.items():
        if kept.chunks is not None:
            planned[name] = _chunked_beside(obj[name], kept.chunks)
    return obj.assign(planned)


def _gathered(result: xr.DataArray | xr.Dataset) -> tuple[int, str]:
    """What ``.compute()`` gathers into one worker at once: bytes, and the variable (Dataset).

    A Dataset's Dask-backed variables are gathered one at a time, each by a ``finalize-``
    task of its own; NumPy-backed ones never reach a worker.
    """
    sizes = _dask_sizes(result)
    if not sizes:
        return 0, ""
    largest = max(sizes, key=sizes.__getitem__)
    return sizes[largest], largest


def _dask_bytes(result: xr.DataArray | xr.Dataset) -> int:
    """Bytes of ``result``'s Dask-backed variables, all of them: the pieces computing makes."""
    return sum(_dask_sizes(result).values())


def _dask_sizes(result: xr.DataArray | xr.Dataset) -> dict[str, int]:
    """Bytes of each Dask-backed variable of ``result`` (a DataArray's under ``""``)."""
    if isinstance(result, xr.DataArray):
        return {"": int(result.nbytes)} if result.chunks is not None else {}
    return {str(n): int(v.nbytes) for n, v in result.variables.items() if v.chunks is not None}


def _with_untouched_coords(result: xr.Dataset, source: xr.Dataset) -> xr.Dataset:
    """``result`` with the coordinates of ``source`` along dims the operator left as they were.

    xarray's reductions, ``groupby``, ``resample`` and ``rolling`` keep a Dataset's coordinates
    along dims they do not reduce or resize: a ``lev`` that no variable is left along, after
    ``deptho`` was dropped, was lost (a new user's trial). A dim is changed where a variable of
    ``source`` has it and ``result`` lacks it or has another length.
    """
    changed = {
        d
        for d in source.dims
        if (d in result.dims and result.sizes[d] != source.sizes[d])
        or (d not in result.dims and any(d in v.dims for v in source.data_vars.values()))
    }
    kept = {
        name: coord
        for name, coord in source.coords.items()
        if name not in result.variables and not set(coord.dims) & changed
    }
    return result.assign_coords(kept) if kept else result


def _chunked_beside(da: xr.DataArray, chunks: Mapping[str, int]) -> xr.DataArray:
    """A kept variable in ``chunks``: read so from its file, else rechunked in the graph."""
    from dask.array.core import normalize_chunks

    sizes = tuple(chunks[str(d)] for d in da.dims)
    tuples = dict(zip(map(str, da.dims), normalize_chunks(sizes, da.shape), strict=True))
    if input_kind(da) is InputKind.FILE:
        return read_chunked(da, tuples)
    return _rechunked_in_graph(da, tuples, da.dtype.itemsize * math.prod(sizes))


def _rechunked_in_graph(
    da: xr.DataArray, chunks: Mapping[str, tuple[int, ...]], chunk_bytes: int
) -> xr.DataArray:
    """``da`` rechunked by Dask's tasks, its intermediate blocks capped at ``chunk_bytes``."""
    limits = {"array.rechunk.method": "tasks", "array.chunk-size": f"{max(chunk_bytes, 1)}B"}
    with dask.config.set(limits):
        return da.chunk(chunks)


def _plan_summary(chunk_plan: ChunkPlan) -> str:
    chunks = ", ".join(f"{d}={c}" for d, c in chunk_plan.chunks.items())
    size = chunk_plan.budget.format
    return (
        f"{chunk_plan.operator}: chunks {chunks}; predicted peak per task "
        f"{size(chunk_plan.predicted_peak_bytes)} of {size(chunk_plan.budget.per_task)}"
    )

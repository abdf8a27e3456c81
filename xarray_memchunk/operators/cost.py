"""One planned variable under one operator, resolved once: :class:`TaskCost`.

Planning asks the same questions of every variable many times (how is each dim used, what does
a task of these extents need, how long does it take); the answers depend on the variable's
dims, dtype, device and the operator's arguments only, so they are resolved once here: the
operator's :meth:`~xarray_memchunk.operators.base.Operator.dims` and
:meth:`~xarray_memchunk.operators.base.Operator.cost` asked once (:func:`bind_cost`), then the
calibration under the cost's key looked up, and what runs taught applied
(:func:`resolve_cost`). Planning, runs and reports read the key from
:attr:`TaskCost.calibration_key`; calibration from the :class:`Cost` of the tasks it profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from ..errors import CalibrationError, MemchunkError
from ..models import Calibration, LinearMemoryModel, load_calibration
from ..models.calibration import describe_calibration, short_path
from ..models.learned import Learned, LearnedMemoryModel, load_learned
from ..planning.footprint import InputKind, InputLayout
from ..planning.problem import DimUse
from .base import Cost, Features, Operator
from .production import InputProduction, input_production
from .sources import input_kind, reads_own_range, reads_serialized, source_chunks

__all__ = [
    "TaskCost",
    "bind_cost",
    "produced_input",
    "resolve_cost",
    "squared_extent_feature",
    "with_squared_extents",
]


def squared_extent_feature(dim: str) -> str:
    """Name of the feature ``extent(dim)**2 x itemsize``: a cost quadratic in one dim."""
    return f"{dim}_extent_squared_bytes"


def with_squared_extents(
    features: Features,
    dims: tuple[str, ...] | list[str],
    itemsize: int,
) -> Features:
    """``features`` plus :func:`squared_extent_feature` of each of ``dims``.

    Self-calibration adds them where a function's memory grows faster than its block along a
    dim (``g = b.T @ b`` holds ``extent**2`` elements of the dim it keeps).
    """
    if not dims:
        return features

    def extended(padded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = features(padded)
        for dim in dims:
            extent = np.asarray(padded[dim], dtype=np.float64)
            values[squared_extent_feature(dim)] = extent * extent * itemsize
        return values

    return extended


@dataclass(frozen=True)
class TaskCost:
    """What one task of an operator on one variable costs, resolved once.

    Attributes
    ----------
    variable
        Variable name.
    dims, sizes
        The variable's dims and their lengths.
    dtype
        The variable's dtype.
    device
        ``"cpu"`` (NumPy data) or ``"gpu"`` (CuPy).
    uses
        How the operator uses each dim (dims left out are free).
    model
        The memory model: peak bytes of one task from its features.
    model_source
        Where the model came from, in words: ``"shipped calibration median-cpu.json"``, ``"your
        calibration ~/...json"`` (:func:`~xarray_memchunk.models.calibration.describe_calibration`),
        or ``"analytic (not calibrated)"``.
    seconds_per_element
        Compute time per padded input element of one task, every pass over the data included.
    tasks_per_chunk
        Dask tasks the computation creates per planned chunk (scheduling overhead).
    combine_seconds_per_chunk
        Compute time each planned chunk adds to the combining steps after its own task
        (:attr:`~xarray_memchunk.operators.base.Cost.combine_elements_per_chunk` at the time
        per element and pass, once: the steps run once, not per pass).
    layout
        How the data comes in (file, graph, memory; its chunks).
    features
        The operator's task features for padded extents (bound to this variable), with the
        squared extents its calibration adds.
    calibration
        The calibration the model comes from, or None for an analytic or given model.
    calibration_key
        The operator's calibration key for these arguments (:attr:`Cost.calibration_key`): its
        calibration and learned files are named after it.
    learned
        What runs taught about the model (already applied to ``model``), or None.
    production
        What producing one block of the input measured (a graph's data), or None.
    """

    variable: str
    dims: tuple[str, ...]
    sizes: Mapping[str, int]
    dtype: np.dtype
    device: str
    uses: Mapping[str, DimUse]
    model: LinearMemoryModel | LearnedMemoryModel
    model_source: str
    seconds_per_element: float
    tasks_per_chunk: float
    layout: InputLayout
    features: Features
    calibration: Calibration | None = None
    calibration_key: str = ""
    learned: Learned | None = None
    production: InputProduction | None = None
    combine_seconds_per_chunk: float = 0.0

    @property
    def max_extents(self) -> dict[str, float]:
        """Largest padded extent per dim the model was measured on, where it must not go past.

        Set by self-calibration for dims along which memory grew faster than the block.
        """
        fit = self.calibration.metadata.get("fit", {}) if self.calibration else {}
        return {str(d): float(n) for d, n in (fit.get("max_extents") or {}).items()}

    @property
    def max_task_elements(self) -> float | None:
        """Largest task (padded elements) the model was measured on, or None.

        Set for models that must not be extrapolated (self-calibrated ones); None where they
        may.
        """
        value = (self.calibration.metadata.get("fit", {}) if self.calibration else {}).get(
            "max_task_elements"
        )
        return float(value) if value else None

    def peak_bytes(self, padded: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted peak bytes of one task per candidate, from padded extents of every dim."""
        return self.model.peak_bytes(self.features({d: padded[d] for d in self.dims}))


def bind_cost(
    operator: Operator, da: xr.DataArray, kwargs: Mapping[str, Any]
) -> tuple[dict[str, DimUse], Cost]:
    """How the operator uses ``da``'s dims, and its :class:`Cost` on ``da``.

    The one path from a variable to the operator's cost: planning and calibration both take
    it.

    Raises
    ------
    MemchunkError
        When the operator does not compute on ``da``'s dtype.
    DimensionError
        When ``da`` lacks a dim the operator needs.
    """
    dtype = np.dtype(da.dtype)
    if dtype.kind not in operator.dtype_kinds:
        # cftime dates (time bounds of a noleap calendar) are objects: no astype makes numbers
        advice = (
            "its values are dates or Python objects (cftime dates, strings), which memchunk "
            "does not plan: compute such a variable (time bounds) with xarray itself"
            if dtype.kind in "OMmSU"
            else "convert the data first, e.g. .astype('float32')"
        )
        raise MemchunkError(f"{operator.name} does not compute on dtype {dtype}: {advice}")
    return operator.dims(da, **kwargs), operator.cost(da, **kwargs)


def produced_input(da: xr.DataArray) -> InputProduction | None:
    """What producing a block of ``da`` holds, for data a Dask graph produces; else None.

    Measured once per graph (:func:`~xarray_memchunk.operators.production.input_production`).
    """
    return input_production(da) if input_kind(da) is InputKind.GRAPH else None


def resolve_cost(
    operator: Operator,
    name: str,
    da: xr.DataArray,
    uses: Mapping[str, DimUse],
    cost: Cost,
    device: str,
) -> TaskCost:
    """Resolve ``operator``'s cost on variable ``da`` once.

    Parameters
    ----------
    uses, cost
        How the operator uses ``da``'s dims, and its cost on ``da``, as :func:`bind_cost`
        gives them: the calibration (under ``cost.calibration_key``, for ``da``'s dtype and
        ``device``) replaces the analytic model, and what runs taught raises it.

    Raises
    ------
    CalibrationError
        When a calibration file exists but is not valid, or when neither a calibration nor
        an analytic model exists.
    """
    dtype = np.dtype(da.dtype)
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    key, features = cost.calibration_key, cost.features
    calibration = load_calibration(key, device, dtype.name)
    if calibration is not None:
        squared = calibration.metadata.get("fit", {}).get("squared_dims") or []
        features = with_squared_extents(features, [str(d) for d in squared], dtype.itemsize)
        model, seconds, source = (
            calibration.model,
            calibration.seconds_per_element_at(sizes, cost.work_per_element),
            describe_calibration(calibration.path),
        )
    elif cost.model is not None:
        model, seconds = cost.model, cost.seconds_per_element
        source = "analytic (not calibrated)"
    else:
        todo = "plan it (it calibrates itself) or " if cost.measurable else ""
        raise CalibrationError(
            f"operator {operator.name!r} has no memory model for {dtype} yet: {todo}run "
            f"xarray_memchunk.calibrate"
        )
    learned = load_learned(key, device, dtype.name)
    if learned is not None and learned.scale(model) > 1.0:
        source = f"{source}, {learned.describe(model)} ({short_path(learned.path)})"
        model = learned.applied_to(model)
    dims = tuple(str(d) for d in da.dims)
    production = produced_input(da)
    return TaskCost(
        variable=name,
        dims=dims,
        sizes=sizes,
        dtype=dtype,
        device=device,
        uses=dict(uses),
        model=model,
        model_source=source,
        seconds_per_element=seconds * cost.passes,
        tasks_per_chunk=cost.tasks_per_chunk,
        layout=InputLayout(
            name,
            dims,
            dtype.itemsize,
            input_kind(da),
            source_chunks(da),
            cost.held_share,
            cost.factors_bytes_per_chunk,
            reads_own_range(da),
            production.extra_bytes if production else 0.0,
            production.held_bytes if production and cost.fuses_with_input else 0.0,
            cost.runtime_bytes,
            reads_serialized(da),
            making_shares=production.making_shares if production else (),
            source_block_count=production.block_count if production else 0,
        ),
        production=production,
        features=features,
        calibration=calibration,
        calibration_key=key,
        learned=learned,
        combine_seconds_per_chunk=seconds * cost.combine_elements_per_chunk,
    )

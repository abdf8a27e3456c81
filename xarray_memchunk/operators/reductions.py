"""Reductions: tree ones (sum, mean, std, var, min, max), whole-dim ones (median, quantile).

Each reduction is one row of :data:`SPECS` (as flox describes its aggregations): what it
accepts, whether it needs the reduced dims whole, what its partial results weigh, and what
computes it.

Tree reductions let the reduced dims be chunked: each task reduces one chunk to a partial
result and ``dask`` combines up to ``split_every`` partials per task in a tree, so every dim is
free. Those combine tasks hold their partials and their concatenation: with short chunks of the
reduced dim they need more than the chunk tasks themselves (a std over 4 one-day chunks of
500 x 600: 54 x a chunk), which the ``combine_bytes`` feature models. ``median`` and
``quantile`` need the reduced dims whole (as ``dask.array.median`` does): the plan chunks the
other dims instead, and they run blockwise (:mod:`~xarray_memchunk.operators.whole_dims`).

What ``dask`` really runs is not what NumPy runs on the same block: ``std`` of float32 data
computes its moments in float64 (``d = x - mean`` and ``d**2`` are 2 x the block each, and
``nansum`` copies ``d**2`` to replace NaNs: 7.25 x a float32 block in a worker, against 2.5 x
for ``numpy.nanvar``). Calibrations are profiled on the Dask graph for that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from ..errors import DimensionError, MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .arguments import check_number, reject_unknown
from .base import Cost, DimUse, Operator
from .dims import resolve_dims
from .whole_dims import check_quantile_args, keeps_attrs, median, quantile

__all__ = ["REDUCTIONS", "SPECS", "Reduction", "ReductionSpec", "split_every", "tree_shape"]

#: ``numpy.nanmedian`` switches from masked arrays to 1-D slices at this reduced length.
NANMEDIAN_SMALL_AXIS = 600


@dataclass(frozen=True)
class ReductionSpec:
    """One reduction.

    Attributes
    ----------
    name
        Its name, as xarray's method.
    whole
        The reduced dims must be one chunk (median, quantile).
    options
        Keyword arguments it accepts besides ``dim``, ``skipna`` and ``keep_attrs``.
    partial_bytes
        Bytes per output element of one partial result in Dask's tree (0: the input's itemsize,
        for min and max). Sum carries 8 (integers sum to int64; 8 bounds float32 too), mean a
        count and a sum in float64, std and var a count, a sum and a second moment.
    input_factor
        Analytic temporaries per input byte, used until calibrated.
    dtype_kinds
        Kinds of dtype it reduces (datetimes for mean, min and max, as xarray does).
    blockwise
        What computes it over whole dims, one NumPy call per chunk (median, quantile); None:
        xarray's own method.
    check
        Checks its options (quantile's ``q`` and ``method``) and returns them.
    small_axis
        Has NumPy's small-axis path (``nanmedian``'s masked copies below
        :data:`NANMEDIAN_SMALL_AXIS`): the ``small_axis_bytes`` feature.
    zeros_unreduced
        A variable without the reduced dims is reduced to zeros (std, var), which needs
        numbers; the others give its values back.
    calibrate_with
        Options used when calibrating (quantile's ``q``).
    """

    name: str
    whole: bool = False
    options: tuple[str, ...] = ()
    partial_bytes: int = 0
    input_factor: float = 2.5
    dtype_kinds: str = "biufc"
    blockwise: Callable[..., xr.DataArray] | None = None
    check: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    small_axis: bool = False
    zeros_unreduced: bool = False
    calibrate_with: Mapping[str, Any] = field(default_factory=dict)


SPECS = {
    spec.name: spec
    for spec in (
        ReductionSpec("sum", partial_bytes=8),
        ReductionSpec("mean", partial_bytes=16, dtype_kinds="biufcmM"),
        ReductionSpec(
            "std", options=("ddof",), partial_bytes=24, input_factor=7.5, zeros_unreduced=True
        ),
        ReductionSpec(
            "var", options=("ddof",), partial_bytes=24, input_factor=7.5, zeros_unreduced=True
        ),
        ReductionSpec("min", input_factor=1.5, dtype_kinds="biufcmM"),
        ReductionSpec("max", input_factor=1.5, dtype_kinds="biufcmM"),
        ReductionSpec("median", whole=True, input_factor=4.0, blockwise=median, small_axis=True),
        ReductionSpec(
            "quantile",
            whole=True,
            dtype_kinds="iuf",  # numpy's quantile takes real numbers: no bool, no complex
            options=("q", "method"),
            input_factor=4.0,
            blockwise=quantile,
            check=check_quantile_args,
            calibrate_with={"q": 0.9},
        ),
    )
}


def split_every() -> int:
    """Partials a combine task takes: the dask config key ``split_every`` (4 by default)."""
    import dask

    return int(dask.config.get("split_every", 4) or 4)


def tree_shape(n_chunks: np.ndarray, n_axes: int) -> tuple[np.ndarray, np.ndarray]:
    """Partials one combine task takes along one reduced axis, and the tree's depth.

    Dask combines ``split_every`` (config ``split_every``, 4) partials per task, spread over the
    reduced axes: ``max(int(split_every ** (1 / n_axes)), 2)`` along each.
    """
    per_axis = max(int(split_every() ** (1 / max(1, n_axes))), 2)
    fan_in = np.minimum(n_chunks, per_axis)
    depth = np.ceil(np.log(np.maximum(n_chunks, 1)) / np.log(per_axis))
    return fan_in, depth


def _has_dims(da: xr.DataArray, dim: Any) -> bool:
    """Whether ``da`` has the dims ``dim`` names (a 0-d variable has none)."""
    if da.ndim == 0:
        return False
    try:
        resolve_dims(da, dim)
    except DimensionError:
        return False
    return True


class Reduction(Operator):
    """One xarray reduction, planned so that each task fits its memory budget.

    Other Parameters
    ----------------
    dim : str or sequence of str, optional
        Dims to reduce: names, or CF axes / standard names (``dim="T"``). All dims by default.
    skipna : bool, optional
        Skip NaNs, as in xarray (default: True for floats).
    keep_attrs : bool, optional
        Keep the input's attributes, as in xarray (default: xarray's ``keep_attrs`` option).

    ``std`` and ``var`` also take ``ddof`` (default 0); ``quantile`` needs ``q`` and takes
    ``method``.
    """

    keeps_unplanned_variables = True

    #: xarray's reductions and ``numpy.nanmedian`` dispatch to CuPy on CuPy blocks.
    devices = ("cpu", "gpu")

    def __init__(self, spec: ReductionSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.dtype_kinds = spec.dtype_kinds
        kind = "reduced dims whole" if spec.whole else "tree reduction, any dim chunked"
        self.description = f"xarray .{spec.name}() over dim= ({kind})"

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the reduction's arguments before anything runs; raise on unknown ones.

        The reduced dims are resolved against each variable by :meth:`dims`.
        """
        return self._arguments(**kwargs) if da is None else dict(kwargs)

    def _arguments(
        self,
        dim: Hashable | Iterable[Hashable] | None = None,
        skipna: bool | None = None,
        keep_attrs: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The reduction's arguments checked, with their defaults."""
        reject_unknown(
            self.name,
            set(kwargs) - set(self.spec.options),
            ["dim", "skipna", "keep_attrs", *self.spec.options],
        )
        for label, value in (("skipna", skipna), ("keep_attrs", keep_attrs)):
            if value is not None and not isinstance(value, bool | np.bool_):
                raise MemchunkError(
                    f"{self.name} {label} must be True, False or None, got {value!r}"
                )
        if "ddof" in kwargs:
            try:
                check_number(self.name, "ddof", kwargs["ddof"], integer=True)
            except MemchunkError as exc:
                raise MemchunkError(
                    f"{self.name} ddof must be an int >= 0, got {kwargs['ddof']!r}"
                ) from exc
        if self.spec.check is not None:
            kwargs = self.spec.check(kwargs)
        return {"dim": dim, "skipna": skipna, "keep_attrs": keep_attrs, **kwargs}

    def dims(self, da: xr.DataArray, dim=None, **kwargs: Any) -> dict[str, DimUse]:
        """Reduced dims are whole for median/quantile, free otherwise.

        Raises
        ------
        DimensionError
            When ``da`` lacks a reduced dim, or is 0-d (a Dataset keeps such a variable, as
            xarray does: :meth:`skipped`).
        """
        if da.ndim == 0:
            raise DimensionError(f"{self.name} has nothing to reduce in a 0-d variable")
        dims = resolve_dims(da, dim)
        role = DimRole.WHOLE if self.spec.whole else DimRole.FREE
        return {d: DimUse(role) for d in dims}

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """What xarray's reduction does with this variable: keep or drop it.

        Kept when it has none of the reduced dims (reduced over no dim); dropped when its
        dtype cannot be reduced (xarray's ``numeric_only``).
        """
        if _has_dims(da, kwargs.get("dim")):
            return f"{reason}: dropped"
        if self._keeps_unreduced(da):
            zeros = " as zeros (its spread over no dim)" if self.spec.zeros_unreduced else ""
            return f"has none of the reduced dims: kept{zeros}, as xarray keeps it"
        return f"has none of the reduced dims and {self.name} takes no {da.dtype}: dropped"

    def _keeps_unreduced(self, da: xr.DataArray) -> bool:
        """Whether the result keeps a variable without the reduced dims, as xarray's does."""
        return not self.spec.zeros_unreduced or da.dtype.kind in self.dtype_kinds

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """Input and output bytes, and ``combine_bytes`` or ``small_axis_bytes``.

        A task keeps the extents of the dims it does not reduce: its output, in float64 for
        mean, std and var (8 bytes an element at least).

        ``combine_bytes``: the partial results one combine task concatenates (``fan_in``
        partials of one chunk's output, ``partial_bytes`` each), doubled where the tree has
        further levels whose partials wait meanwhile; 0 when the reduced dims are one chunk
        (the chunk and aggregate steps fuse into one task).

        ``small_axis_bytes``: ``numpy.nanmedian`` works on masked copies of the whole block
        (~5x the input) when the reduced length is under :data:`NANMEDIAN_SMALL_AXIS`, and 1-D
        slice by slice (~1x) from there on; this is the input bytes in the first case, 0 in
        the second, so one linear model covers both.

        The analytic model: temporaries proportional to the input (the spec's
        ``input_factor``), partials combined in fours, 8 MiB fixed. Calibrated under the
        reduction's name.
        """
        spec = self.spec
        uses = self.dims(da, **kwargs)
        itemsize = np.dtype(da.dtype).itemsize
        out_itemsize = max(itemsize, 8) if spec.partial_bytes > 8 else itemsize
        sizes = {str(d): int(n) for d, n in da.sizes.items()}

        def features(extents: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            reduced = [d for d in uses if d in extents]
            kept = [np.asarray(v, dtype=np.float64) for d, v in extents.items() if d not in uses]
            out_elements = np.prod(kept, axis=0) if kept else 1.0
            input_bytes = itemsize * np.prod(
                [np.asarray(v, dtype=np.float64) for v in extents.values()], axis=0
            )
            out_elements = np.broadcast_to(out_elements, np.shape(input_bytes))
            values = {"input_bytes": input_bytes, "output_bytes": out_elements * out_itemsize}
            if spec.small_axis:
                length = np.prod(
                    [np.asarray(extents[d], dtype=np.float64) for d in reduced], axis=0
                )
                small = np.asarray(length) < NANMEDIAN_SMALL_AXIS
                values["small_axis_bytes"] = np.where(small, input_bytes, 0.0)
            if spec.whole:
                return values
            fan_in = np.ones_like(input_bytes)
            depth = np.zeros_like(fan_in)
            for d in reduced:
                n = np.ceil(sizes[d] / np.asarray(extents[d], dtype=np.float64))
                axis_fan_in, axis_depth = tree_shape(n, len(reduced))
                fan_in = fan_in * axis_fan_in
                depth = np.maximum(depth, axis_depth)
            partial = spec.partial_bytes or itemsize
            levels = np.minimum(depth, 2)
            values["combine_bytes"] = np.where(
                fan_in > 1, out_elements * partial * fan_in * levels, 0.0
            )
            return values

        coefficients = {"input_bytes": spec.input_factor, "output_bytes": 2.0}
        if spec.small_axis:
            coefficients["small_axis_bytes"] = 4.0
        if not spec.whole:
            coefficients["combine_bytes"] = 3.0
        model = LinearMemoryModel(coefficients, intercept=8 * 2**20)
        # the whole-dim ones compute after a task of their own (``nanmedian``): not fused
        return Cost(
            self.name, features, model, seconds_per_element=2e-9, fuses_with_input=not spec.whole
        )

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list]:
        """``dim="time"`` (and the spec's ``calibrate_with``); chunks from 0.1 to 64 MB.

        Chunks long and short in the reduced dim, for ``(time, y, x)``. Tree reductions add
        arrays of several chunks along ``time``, so that combine tasks (short chunks, large
        partials) are profiled too.
        """
        sizes = [
            (30, 40, 80),
            (365, 20, 20),
            (10, 300, 300),
            (120, 100, 100),
            (365, 90, 180),
            (50, 400, 400),
            (730, 100, 120),
            (1000, 120, 130),
            (200, 300, 260),
            (600, 40, 50),
            (2000, 60, 80),
            (599, 100, 100),
        ]
        shapes: list = [{"time": t, "y": y, "x": x} for t, y, x in sizes]
        if not self.spec.whole:
            for t, n, y, x in [
                (1, 4, 500, 600),
                (2, 16, 300, 400),
                (5, 4, 400, 500),
                (1, 64, 200, 300),
            ]:
                extents = {"time": t, "y": y, "x": x}
                shapes.append((extents, extents | {"time": t * n}))
        return self.check_arguments({"dim": "time", **self.spec.calibrate_with} | kwargs), shapes

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Run the reduction on ``da`` (chunked per the plan), lazily."""
        if self.spec.blockwise is not None:
            options = {
                k: kwargs[k] for k in ("skipna", "keep_attrs", *self.spec.options) if k in kwargs
            }
            return self.spec.blockwise(da, list(uses), **options)
        return self._xarray(da, list(uses), **kwargs)

    def _xarray(self, da: xr.DataArray, dims: list[str], **kwargs: Any) -> xr.DataArray:
        """Xarray's own method on ``da`` with the reduction's arguments."""
        options = {k: kwargs[k] for k in self.spec.options if k in kwargs}
        args = (options.pop("q"),) if "q" in options else ()
        common = {"skipna": kwargs.get("skipna"), "keep_attrs": kwargs.get("keep_attrs")}
        return getattr(da, self.name)(*args, dim=dims, **common, **options)

    def compute_dataset(self, ds, uses, **kwargs):
        """Reduce the planned variables; keep the others as xarray's Dataset reductions do.

        Variables without any of the reduced dims are kept, reduced over no dim (the values
        themselves; zeros for std and var), as xarray does. Variables whose dtype the reduction
        does not take are dropped (xarray's ``numeric_only``).
        """
        result = {}
        for name, var in ds.data_vars.items():
            if name in uses:
                result[name] = self.compute(var, uses[name], **kwargs)
            elif not _has_dims(var, kwargs.get("dim")) and self._keeps_unreduced(var):
                numeric = var.dtype.kind in self.dtype_kinds
                result[name] = self._xarray(var, [], **kwargs) if numeric else var
        keep = keeps_attrs(self.name, kwargs.get("keep_attrs"), dataset=True)
        return xr.Dataset(result, attrs=ds.attrs if keep else {})


REDUCTIONS = tuple(Reduction(spec) for spec in SPECS.values())
#: Registered as built-in operators (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = REDUCTIONS

"""Reductions: tree ones (sum, mean, std, var, min, max), whole-dim ones (median, quantile).

Tree reductions let the reduced dims be chunked: each task reduces one chunk to a partial result
and partials are combined in a tree, so every dim is free. ``median`` and ``quantile`` need the
reduced dims whole (as ``dask.array.median`` does): the plan chunks the other dims instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .base import DimUse, Operator
from .dims import resolve_dims

__all__ = ["Reduction", "REDUCTIONS"]

#: Analytic bytes of temporaries per input byte of one task (before calibration): a
#: conservative guess from the numpy functions each runs (masks for NaNs, deviations for
#: std/var, a sorted copy for median/quantile).
_INPUT_FACTORS = {
    "sum": 2.5,
    "mean": 2.5,
    "min": 2.5,
    "max": 2.5,
    "std": 4.0,
    "var": 4.0,
    "median": 4.0,
    "quantile": 4.0,
}
_WHOLE = {"median", "quantile"}
#: ``numpy.nanmedian`` switches from masked arrays to 1-D slices at this reduced length.
NANMEDIAN_SMALL_AXIS = 600


class Reduction(Operator):
    """One xarray reduction, planned so that each task fits its memory budget.

    Other Parameters
    ----------------
    dim : str or sequence of str, optional
        Dims to reduce: names, or CF axes / standard names (``dim="T"``). All dims by default.
    skipna : bool, optional
        Skip NaNs, as in xarray (default: True for floats).

    ``std`` and ``var`` also take ``ddof`` (default 0); ``quantile`` needs ``q``.
    """

    default_seconds_per_element = 2e-9
    #: xarray's reductions and ``numpy.nanmedian`` dispatch to CuPy on CuPy blocks.
    devices = ("cpu", "gpu")

    def __init__(self, name: str) -> None:
        self.name = name
        self.whole = name in _WHOLE
        kind = "reduced dims whole" if self.whole else "tree reduction, any dim chunked"
        self.description = f"xarray .{name}() over dim= ({kind})"

    def normalize_kwargs(
        self,
        dim: Hashable | Iterable[Hashable] | None = None,
        skipna: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Check the reduction's arguments; raise on unknown ones."""
        allowed = {"std": {"ddof"}, "var": {"ddof"}, "quantile": {"q", "method"}}.get(
            self.name, set()
        )
        self.reject_unknown(set(kwargs) - allowed, ["dim", "skipna", *sorted(allowed)])
        if self.name == "quantile":
            if "q" not in kwargs:
                raise MemchunkError("'quantile' needs q=, e.g. q=0.9 or q=[0.1, 0.5, 0.9]")
            q = np.asarray(kwargs["q"], dtype=float)
            if np.any((q < 0) | (q > 1)):
                raise MemchunkError(f"quantile q must be within [0, 1], got {kwargs['q']!r}")
        return {"dim": dim, "skipna": skipna, **kwargs}

    def dim_uses(self, da: xr.DataArray, dim=None, **kwargs: Any) -> dict[str, DimUse]:
        """Reduced dims are whole for median/quantile, free otherwise."""
        dims = resolve_dims(da, dim)
        role = DimRole.WHOLE if self.whole else DimRole.FREE
        return {d: DimUse(role) for d in dims}

    def output_extents(self, extents, uses, **kwargs):
        """A task keeps the extents of the dims it does not reduce."""
        reduced = set(uses)
        return {d: (np.ones_like(v) if d in reduced else v) for d, v in extents.items()}

    def task_features(self, extents, uses, itemsize, sizes=None, **kwargs):
        """Input and output bytes; for median also ``small_axis_bytes``.

        ``numpy.nanmedian`` works on masked copies of the whole block (~5x the input) when
        the reduced length is under :data:`NANMEDIAN_SMALL_AXIS`, and 1-D slice by slice
        (~1x) from there on; ``small_axis_bytes`` is the input bytes in the first case, 0 in
        the second, so one linear model covers both.
        """
        features = super().task_features(extents, uses, itemsize, sizes=sizes, **kwargs)
        if self.name == "median":
            reduced = np.prod([np.asarray(extents[d], dtype=np.float64) for d in uses], axis=0)
            small = np.asarray(reduced) < NANMEDIAN_SMALL_AXIS
            features["small_axis_bytes"] = np.where(small, features["input_bytes"], 0.0)
        return features

    def output_itemsize(self, itemsize: int, **kwargs: Any) -> int:
        """Partial results of mean/std/var carry sums and counts: 8 bytes an element at least."""
        return max(itemsize, 8) if self.name in {"mean", "std", "var"} else itemsize

    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """Temporaries proportional to the input, partials combined in fours, 8 MiB fixed."""
        coefficients = {"input_bytes": _INPUT_FACTORS[self.name], "output_bytes": 8.0}
        if self.name == "median":
            coefficients["small_axis_bytes"] = 4.0
        return LinearMemoryModel(coefficients, intercept=8 * 2**20)

    def calibration_kwargs(self) -> dict[str, Any]:
        """Reduce over ``time`` (and take the 90th percentile for quantile)."""
        return {"dim": "time"} | ({"q": 0.9} if self.name == "quantile" else {})

    def calibration_shapes(self, **kwargs: Any) -> list[dict[str, int]]:
        """Chunks from 0.1 to 64 MB, long and short in the reduced dim, for ``(time, y, x)``."""
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
        return [{"time": t, "y": y, "x": x} for t, y, x in sizes]

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Run the reduction on ``da`` (chunked per the plan), lazily."""
        dims = list(uses)
        skipna = kwargs.get("skipna")
        if self.name == "median":
            return _median(da, dims, skipna)
        if self.name == "quantile":
            extra = {"method": kwargs["method"]} if "method" in kwargs else {}
            return da.quantile(kwargs["q"], dim=dims, skipna=skipna, **extra)
        extra = {"ddof": kwargs["ddof"]} if "ddof" in kwargs else {}
        return getattr(da, self.name)(dim=dims, skipna=skipna, **extra)


def _median(da: xr.DataArray, dims: list[str], skipna: bool | None) -> xr.DataArray:
    """Median over whole ``dims`` that keeps the other dims' chunks as planned.

    ``dask.array.nanmedian`` (what ``DataArray.median`` calls) rechunks the other dims to
    ``"auto"``, merging the planned chunks into ~128 MiB ones; this runs the same numpy
    function blockwise instead.
    """
    use_nan = skipna or (skipna is None and da.dtype.kind in "fc")
    func = np.nanmedian if use_nan else np.median
    axes = tuple(range(-len(dims), 0))
    out_dtype = func(np.zeros((1,) * max(1, len(dims)), dtype=da.dtype)).dtype
    return xr.apply_ufunc(
        func,
        da,
        input_core_dims=[dims],
        kwargs={"axis": axes},
        dask="parallelized",
        output_dtypes=[out_dtype],
        keep_attrs=True,
    )


REDUCTIONS = tuple(
    Reduction(name) for name in ("sum", "mean", "std", "var", "min", "max", "median", "quantile")
)

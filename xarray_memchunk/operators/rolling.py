"""Moving-window reductions along one dim (``rolling``): a stencil whose halo is the window.

``da.memchunk.apply("rolling", dim="time", window=30)`` equals
``da.rolling(time=30).mean()``: each task computes xarray's rolling reduction on its block and
the ``window - 1`` elements before it (a trailing window), or on its block and half a window
each side (``center=True``), so the dim may be cut into chunks however long it is, where a
whole-dim plan would need every step of a location in one task. Data read from a file reads
its halo from the file in the same task (the halo rule), as every stencil does.

The memory of a task is measured on the first plan (as for a NumPy function): xarray's
rolling reductions dispatch to numbagg or bottleneck where installed, whose temporaries this
module does not model by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError
from ..planning.problem import DimRole
from .arguments import check_number, reject_unknown
from .base import Cost, DimUse, Operator
from .blockwise import BlockwiseOperator
from .dims import has_dim, resolve_dim

__all__ = ["REDUCTIONS", "Rolling", "rolling_block", "window_halo"]

#: The reductions a window may take: xarray's ``DataArrayRolling`` methods.
REDUCTIONS = ("mean", "sum", "std", "var", "min", "max", "median", "count", "prod")


def window_halo(window: int, center: bool) -> tuple[int, int]:
    """Elements before and after an output element that its window reads, as xarray places it.

    A trailing window ends at the element (``window - 1`` before it); a centred one puts
    ``window // 2`` before it and the rest after.
    """
    if not center:
        return window - 1, 0
    return window // 2, window - 1 - window // 2


def rolling_block(
    block: np.ndarray,
    *,
    axis: int,
    window: int,
    center: bool,
    reduction: str,
    min_periods: int | None,
) -> np.ndarray:
    """Apply xarray's rolling ``reduction`` to ``block`` along ``axis`` (shape kept)."""
    dims = [f"dim_{i}" for i in range(block.ndim)]
    rolled = xr.DataArray(block, dims=dims).rolling(
        {dims[axis]: window}, center=center, min_periods=min_periods
    )
    return getattr(rolled, reduction)().values


def _arguments(
    dim: str | None = None,
    window: int | None = None,
    center: bool = False,
    reduction: str = "mean",
    min_periods: int | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """The arguments checked, with their defaults."""
    reject_unknown(Rolling.name, unknown, _arguments)
    if dim is None or window is None:
        raise MemchunkError(
            "rolling needs dim= and window=, e.g. memchunk.apply('rolling', dim='time', "
            "window=30) for da.rolling(time=30).mean()"
        )
    window = int(check_number(Rolling.name, "window", window, integer=True, minimum=1))
    if not isinstance(center, bool | np.bool_ | int | np.integer) or center not in (0, 1):
        raise MemchunkError(f"rolling center must be True or False, got {center!r}")
    if reduction not in REDUCTIONS:
        raise MemchunkError(
            f"rolling reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}"
        )
    if min_periods is not None:
        min_periods = int(
            check_number(Rolling.name, "min_periods", min_periods, integer=True, minimum=1)
        )
        if min_periods > window:
            raise MemchunkError(
                f"rolling min_periods ({min_periods}) must not exceed window ({window})"
            )
    return {
        "dim": dim,
        "window": window,
        "center": bool(center),
        "reduction": reduction,
        "min_periods": min_periods,
    }


class Rolling(Operator):
    """A moving-window reduction along one dim: ``da.rolling({dim: window}, center=...)``.

    Keyword Arguments:
    -----------------
    dim : str
        The dim the window moves along (a name or a CF axis, e.g. ``"T"``).
    window : int
        Elements in a window.
    center : bool, default False
        Label each window at its centre (else at its last element, a trailing window).
    reduction : str, default "mean"
        One of :data:`REDUCTIONS`.
    min_periods : int, optional
        Least elements a window needs for a value (``window`` by default, as in xarray).
    """

    keeps_unplanned_variables = True

    name = "rolling"
    description = (
        "moving-window reduction along one dim (dim=, window=, center=, reduction=): "
        "a halo of the window"
    )
    dtype_kinds = "iuf"
    #: Measured on its first plan for each set of arguments: nothing is shipped.
    shipped_calibrations = ()

    def __init__(self) -> None:
        #: The block function's operator per halo: its identity keys the self-calibration.
        self._blockwise: dict[tuple[str, tuple[int, int]], BlockwiseOperator] = {}

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs; with ``da``, resolve ``dim`` in it.

        Raises
        ------
        MemchunkError
            On a missing or invalid argument, an unknown one, or ``min_periods`` (the window by
            default) longer than ``dim``: every element NaN.
        DimensionError
            When ``da`` has no such dim.
        """
        if da is None:
            return _arguments(**kwargs)
        dim = resolve_dim(da, kwargs["dim"])
        size, least = da.sizes[dim], kwargs.get("min_periods") or kwargs["window"]
        if least > size:  # a longer window with fewer min_periods is xarray's, and planned
            raise MemchunkError(
                f"rolling window {kwargs['window']} with min_periods={least} on {dim!r} of "
                f"{size} elements: no window holds {least} values, and xarray gives NaN for "
                f"every element. Use a window of at most {size}, or min_periods of at most "
                f"{size} for windows cut by the ends of the dim"
            )
        return dict(kwargs) | {"dim": dim}

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, int]]]:
        """``dim="time"``, ``window=30`` unless given; blocks of 0.1 to 24 million elements."""
        sizes = [(60, 40, 40), (120, 60, 80), (365, 50, 60), (365, 100, 120), (730, 120, 140)]
        shapes = [{"time": t, "y": y, "x": x} for t, y, x in sizes]
        return self.check_arguments({"dim": "time", "window": 30} | kwargs), shapes

    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """The window's dim is a halo dim (the window's reach before and after); others free."""
        dim = resolve_dim(da, kwargs["dim"])
        return {dim: DimUse(DimRole.HALO, window_halo(kwargs["window"], kwargs["center"]))}

    def _operator(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> BlockwiseOperator:
        dim = resolve_dim(da, kwargs["dim"])
        halo = window_halo(kwargs["window"], kwargs["center"])
        key = (dim, halo)
        if key not in self._blockwise:
            self._blockwise[key] = BlockwiseOperator(self.name, rolling_block, depth={dim: halo})
        return self._blockwise[key]

    def _block_kwargs(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        block = {k: v for k, v in kwargs.items() if k != "dim"}
        return block | {"axis": da.get_axis_num(resolve_dim(da, kwargs["dim"]))}

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """Measured on the first plan: the block function's cost, keyed by all the arguments."""
        return self._operator(da, kwargs).cost(da, **self._block_kwargs(da, kwargs))

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """The rolling reduction, lazily: one task per chunk, with the window's halo."""
        operator = self._operator(da, kwargs)
        result = operator.compute(da, uses, **self._block_kwargs(da, kwargs))
        return result.rename(da.name)

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """A variable without the window's dim is kept as it is, as xarray keeps it."""
        if not has_dim(da, kwargs["dim"]):
            return f"has no dim {kwargs['dim']!r}: kept as it is, as xarray keeps it"
        return super().skipped(da, reason, **kwargs)

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """Roll the planned variables; keep those without the dim as they are, as xarray does."""
        result = {
            name: self.compute(var, uses[name], **kwargs) if name in uses else var
            for name, var in ds.data_vars.items()
            if name in uses or not has_dim(var, kwargs["dim"])
        }
        return xr.Dataset(result, attrs=ds.attrs)


#: Registered as a built-in operator (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (Rolling(),)

"""Resampling reductions along time (``resample``): chunks that end at bin edges, flox blockwise.

``da.memchunk.apply("resample", freq="1MS")`` equals ``da.resample(time="1MS").mean()``. A
bin (a month of days) is never cut: the plan cuts ``time`` at bin edges only, packing as many
whole bins into a chunk as fit its memory budget, so that each task reduces its own bins and
needs nothing from any other task (flox's ``method="blockwise"``). ``time`` need not be whole,
and data stored one day per chunk is read as it is stored, each task reading its own days.

The memory of a task is measured on the first plan for each reduction and frequency (as for a
NumPy function): flox's kernels (numbagg or numpy-groupies where installed) are measured, not
modelled by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError
from ..planning.problem import DimRole
from .arguments import reject_unknown
from .base import Cost, DimUse, Operator, padded_elements
from .dims import resolve_dim
from .grouping import (
    grouped_variables,
    kept_by_grouping,
    not_calibrated_apart,
    note_unplanned,
    uses_flox,
)

__all__ = ["REDUCTIONS", "Resample", "bin_edges"]

#: The reductions a resample may take: flox's blockwise aggregations, as xarray names them.
REDUCTIONS = ("mean", "sum", "std", "var", "min", "max", "median", "count", "prod")


def bin_edges(da: xr.DataArray, dim: str, freq: str) -> tuple[int, ...]:
    """Offsets along ``dim`` where ``da.resample({dim: freq})``'s bins end (empty bins dropped).

    Raises
    ------
    MemchunkError
        When ``dim`` has no increasing time index, or ``freq`` is not a frequency.
    """
    index = da.indexes.get(dim)
    if index is None or not index.is_monotonic_increasing:
        raise MemchunkError(
            f"resample needs an increasing time coordinate along {dim!r} (sort it first: "
            f"da.sortby({dim!r}))"
        )
    ones = xr.DataArray(np.ones(da.sizes[dim]), coords={dim: index}, dims=dim)
    try:
        counts = ones.resample({dim: freq}).count().values
    except (ValueError, TypeError, AttributeError) as exc:
        raise MemchunkError(f"resample cannot bin {dim!r} by freq={freq!r}: {exc}") from exc
    edges = np.cumsum(counts[counts > 0])
    return tuple(int(e) for e in edges)


def _arguments(
    freq: str | None = None,
    dim: str = "time",
    reduction: str = "mean",
    **unknown: Any,
) -> dict[str, Any]:
    """The arguments checked, with their defaults."""
    reject_unknown(Resample.name, unknown, _arguments)
    if not isinstance(freq, str) or not freq:
        raise MemchunkError(
            "resample needs freq=, a pandas frequency, e.g. memchunk.apply('resample', "
            "freq='1MS') for da.resample(time='1MS').mean()"
        )
    if not isinstance(dim, str):
        raise MemchunkError(f"resample dim must be a dim's name, got {dim!r}")
    if reduction not in REDUCTIONS:
        raise MemchunkError(
            f"resample reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}"
        )
    return {"freq": freq, "dim": dim, "reduction": reduction}


def _input_bytes(padded: Mapping[str, np.ndarray], itemsize: int) -> dict[str, np.ndarray]:
    """One task's input bytes (flox's temporaries and the bins' results grow with them)."""
    return {"input_bytes": padded_elements(padded) * itemsize}


class Resample(Operator):
    """A resampling reduction along time: ``da.resample({dim: freq}).<reduction>()``.

    Keyword Arguments:
    -----------------
    freq : str
        The bins, as pandas names frequencies (``"1MS"``: months, ``"1YS"``: years).
    dim : str, default "time"
        The dim resampled (a name or a CF axis, e.g. ``"T"``); its coordinate is the dates.
    reduction : str, default "mean"
        One of :data:`REDUCTIONS`.
    """

    keeps_unplanned_variables = True

    name = "resample"
    description = (
        "xarray .resample(time=freq) reduction (freq=, reduction=): chunks of whole bins, "
        "flox blockwise"
    )
    dtype_kinds = "iuf"
    #: Measured on its first plan for each reduction and frequency: nothing is shipped.
    shipped_calibrations = ()

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs; with ``da``, resolve ``dim`` and bin it.

        Raises
        ------
        MemchunkError
            On a missing or invalid argument, an unknown one, a frequency that cannot bin the
            dim's dates, or dates that do not increase.
        DimensionError
            When ``da`` has no such dim.
        """
        if da is None:
            return _arguments(**kwargs)
        dim = resolve_dim(da, kwargs["dim"])
        bin_edges(da, dim, kwargs["freq"])
        return dict(kwargs) | {"dim": dim}

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list]:
        """None: a resample bins the data's own dates, so it is measured on its first plan.

        Raises
        ------
        MemchunkError
            Always.
        """
        raise not_calibrated_apart("resample", "freq")

    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """The resampled dim is free, cut at bin edges only; the others are free.

        A template without dates (the features of a measured block) has no bins: its dim is
        free. :meth:`check_arguments` has refused data without dates before planning.
        """
        dim = resolve_dim(da, kwargs["dim"])
        if dim not in da.indexes:
            return {dim: DimUse(DimRole.FREE)}
        edges = bin_edges(da, dim, kwargs["freq"])
        longest = int(np.max(np.diff(edges, prepend=0)))
        return {dim: DimUse(DimRole.FREE, min_length=longest, boundaries=edges)}

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """Measured on the first plan, per reduction and frequency: the input's bytes."""
        itemsize = np.dtype(da.dtype).itemsize
        key = f"resample-{kwargs['reduction']}-{kwargs['freq']}"

        def features(padded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return _input_bytes(padded, itemsize)

        return Cost(key, features, None, measurable=True)

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Resample ``da`` (chunked at bin edges) with xarray, by flox's blockwise method."""
        return _resampled(da, **kwargs)

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """Resample the planned variables and those without the dim, with xarray.

        xarray broadcasts a variable without the dim along the bins; the result equals it.
        """
        kept, dates = grouped_variables(ds, uses, kwargs["dim"], kwargs["reduction"])
        result = _resampled(kept, **kwargs)
        if dates:  # with xarray's own method (see grouped_variables)
            bins = ds[dates].resample({kwargs["dim"]: kwargs["freq"]})
            result = result.assign(getattr(bins, kwargs["reduction"])().data_vars)
        return result

    def kept_unplanned(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> list[str]:
        """Those :func:`~.grouping.grouped_variables` computes beside the planned ones."""
        return kept_by_grouping(ds, uses, kwargs["dim"], kwargs["reduction"])

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """A variable without the dim, or dates: as xarray treats it."""
        note = note_unplanned(da, kwargs["dim"], "bins", kwargs["reduction"])
        return note or super().skipped(da, reason, **kwargs)


def _resampled(obj: Any, *, freq: str, dim: str, reduction: str) -> Any:
    """``obj.resample({dim: freq}).<reduction>()``, with flox's blockwise method when used."""
    options = {"method": "blockwise"} if uses_flox(obj) else {}
    return getattr(obj.resample({dim: freq}), reduction)(**options)


#: Registered as a built-in operator (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (Resample(),)

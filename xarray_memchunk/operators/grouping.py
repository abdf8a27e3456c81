"""What the grouped operators (``groupby``, ``resample``) share: flox, and how they calibrate."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import xarray as xr

from ..errors import MemchunkError
from ..units import format_size
from .dims import has_dim, is_dates

__all__ = [
    "DATE_REDUCTIONS",
    "grouped_variables",
    "kept_by_grouping",
    "not_calibrated_apart",
    "note_of_dates",
    "note_unplanned",
    "note_without_dim",
    "uses_flox",
]


#: Reductions xarray runs on variables of any dtype (``numeric_only=False``); the others drop
#: a Dataset's variables that are not numbers, booleans, dates or durations.
ANY_DTYPE_REDUCTIONS = ("count", "min", "max")


def note_without_dim(da: xr.DataArray, dim: str, along: str, reduction: str) -> str:
    """The plan's note on a Dataset's variable ``da`` without ``dim``: what xarray makes of it.

    Broadcast ``along`` the groups or bins; dropped by a reduction of numbers (``mean``) where
    its dtype is not one (text), as xarray drops it.
    """
    if reduction in ANY_DTYPE_REDUCTIONS or da.dtype.kind in "biufcmM":
        return f"has no dim {dim!r}: broadcast along the {along}, as xarray does"
    return (
        f"has no dim {dim!r} and is of dtype {da.dtype}: left out of the result, as xarray's "
        f"{reduction} leaves it"
    )


#: The grouped reductions whose result of dates is dates (bounds stay bounds), which xarray
#: computes in every calendar and for Dask data. xarray's others fail (a groupby's median and
#: quantile; var and prod of cftime dates) or give values that are not bounds (a sum of
#: datetime64 wraps round to 1732, a std reads as 1970-01-09): a Dataset's dates are then
#: left out, with a note, rather than fail the whole result or be written as its bounds.
DATE_REDUCTIONS = ("mean", "min", "max")
#: Bytes of dates along the dim (time bounds) up to which xarray reduces them beside the plan:
#: a ``ds.where(...)`` broadcast a trial's ``time_bnds`` along lat and lon, 1.5 GB of objects
#: no plan bounds; larger ones are left out, with a note.
SMALL_DATES_BYTES = 16 * 2**20


def grouped_variables(
    ds: xr.Dataset, uses: Mapping[str, Any], dim: str, reduction: str
) -> tuple[xr.Dataset, list[str]]:
    """The variables of ``ds`` a grouped reduction along ``dim`` computes, as xarray's does.

    Returns the planned ones (``uses``) with those without ``dim`` (broadcast along the groups
    or bins), and the names of the dates along ``dim`` that memchunk does not plan
    (``time_bnds``). Those were left out, and a written result's ``time`` named bounds that
    were not there; xarray reduces them too, with its own method: flox's ``blockwise`` one
    fails on datetimes (numpy_groupies' exact mean of their integers overflows). Only for the
    reductions of :data:`DATE_REDUCTIONS`; for others they are left out.
    """
    dates = [
        str(name)
        for name, v in ds.data_vars.items()
        if name not in uses
        and dim in v.dims
        and reduction in DATE_REDUCTIONS
        and v.nbytes <= SMALL_DATES_BYTES
        and is_dates(v)
    ]
    keep = [n for n, v in ds.data_vars.items() if n in uses or dim not in v.dims]
    return ds[keep], dates


def kept_by_grouping(
    ds: xr.Dataset, uses: Mapping[str, Any], dim: str, reduction: str
) -> list[str]:
    """The variables of ``ds`` not in ``uses`` that a grouped reduction's result keeps.

    Those :func:`grouped_variables` computes: without ``dim``, or small dates along it.
    """
    kept, dates = grouped_variables(ds, uses, dim, reduction)
    return [str(name) for name in (*kept.data_vars, *dates) if str(name) not in uses]


def note_of_dates(dim: str, along: str, reduction: str) -> str:
    """The plan's note on a variable of dates along ``dim``: reduced as xarray does, or not."""
    if reduction not in DATE_REDUCTIONS:
        return (
            f"dates along {dim!r} (time bounds): left out of the result, since a {reduction} of "
            f"dates is not dates, or fails (they are kept for {', '.join(DATE_REDUCTIONS)})"
        )
    return (
        f"dates along {dim!r} (time bounds), which are small: reduced over the {along} by "
        f"xarray beside the plan, as xarray does"
    )


def note_unplanned(da: xr.DataArray, dim: str, along: str, reduction: str) -> str | None:
    """The note on a Dataset's variable ``da`` a grouped reduction keeps unplanned, or None.

    Without ``dim`` (:func:`note_without_dim`), or dates along it (:func:`note_of_dates`).
    """
    if not has_dim(da, dim):  # a name, or a CF key (dim="T")
        return note_without_dim(da, dim, along, reduction)
    # left out by grouped_variables (objects: not asked whether dates, not computed)
    if da.dtype.kind in "OMm" and da.nbytes > SMALL_DATES_BYTES:
        return (
            f"{da.name!r} along {dim!r}: left out of the result, {format_size(da.nbytes)} of "
            f"dates or objects (broadcast by a where?) that no plan bounds: select or drop "
            f"them first, or compute them with xarray"
        )
    return note_of_dates(dim, along, reduction) if is_dates(da) else None


def not_calibrated_apart(operator: str, argument: str) -> MemchunkError:
    """The error for calibrating apart an operator that groups the data's own coordinates.

    Its groups (months, bins) come from the data, so it is measured on its first plan.
    """
    return MemchunkError(
        f"{operator} is measured on its first plan, on the data's own coordinates: plan it "
        f"(da.memchunk.plan({operator!r}, {argument}=...)) instead of calibrating it apart"
    )


def flox_enabled() -> bool:
    """Whether xarray groups with flox: installed, and its ``use_flox`` option on."""
    enabled = bool(xr.get_options().get("use_flox", True))
    return enabled and importlib.util.find_spec("flox") is not None


def uses_flox(obj: Any) -> bool:
    """Whether xarray reduces ``obj``'s groups with flox (installed, enabled, Dask data).

    Only then does a groupby or resample reduction take flox's ``method=``.
    """
    arrays = obj.data_vars.values() if isinstance(obj, xr.Dataset) else [obj]
    chunked = any(v.chunks is not None for v in arrays)
    return chunked and flox_enabled()

"""What the grouped operators (``groupby``, ``resample``) share: flox, and how they calibrate."""

from __future__ import annotations

import importlib.util
from typing import Any

import xarray as xr

from ..errors import MemchunkError

__all__ = ["not_calibrated_apart", "note_without_dim", "uses_flox"]


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

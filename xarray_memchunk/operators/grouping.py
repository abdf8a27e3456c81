"""Whether xarray groups an object with flox, the library that takes a ``method=``."""

from __future__ import annotations

import importlib.util
from typing import Any

import xarray as xr

__all__ = ["uses_flox"]


def uses_flox(obj: Any) -> bool:
    """Whether xarray reduces ``obj``'s groups with flox (installed, enabled, Dask data).

    Only then does a groupby or resample reduction take flox's ``method=``.
    """
    arrays = obj.data_vars.values() if isinstance(obj, xr.Dataset) else [obj]
    chunked = any(v.chunks is not None for v in arrays)
    enabled = bool(xr.get_options().get("use_flox", True))
    return chunked and enabled and importlib.util.find_spec("flox") is not None

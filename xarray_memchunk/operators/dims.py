"""Resolve the dims an operator acts on: by name, or by CF axis / standard name (cf-xarray)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np
import xarray as xr

from ..errors import DimensionError

__all__ = ["DATES_PROBE_BYTES", "has_dim", "is_dates", "resolve_dim", "resolve_dims"]


def _cf_candidates(obj: xr.DataArray | xr.Dataset, key: str) -> list[str]:
    import cf_xarray  # noqa: F401  (registers the .cf accessor)

    found: list[str] = []
    for mapping in (obj.cf.axes, obj.cf.coordinates, obj.cf.standard_names):
        for name in mapping.get(key, []):
            if name in obj.dims:
                found.append(name)
            elif name in obj.coords and obj.coords[name].ndim == 1:
                found.append(str(obj.coords[name].dims[0]))
    return list(dict.fromkeys(found))


#: Bytes of its first chunk up to which a Dask-backed array of objects is computed to tell
#: whether it holds dates.
DATES_PROBE_BYTES = 2**20


def is_dates(da: xr.DataArray) -> bool:
    """Whether ``da`` holds dates: NumPy datetimes (or durations), or cftime objects.

    Objects are looked at in their first element, which xarray computes with the chunk that
    holds it: a Dask-backed array of objects is looked at so only where its first chunk is
    small (:data:`DATES_PROBE_BYTES`), else by its encoding's ``calendar``. A new user's
    ``ds.where(ds.pr >= 0)`` broadcast ``time_bnds`` to a 2 GB array of cftime dates, whose
    first chunk a plan computed on the cluster to ask: it killed 4 workers before refusing.
    """
    from xarray.core.common import _contains_datetime_like_objects

    if da.dtype.kind == "O" and da.chunks is not None:  # Dask-backed
        first = [c[0] if c else 0 for c in da.chunks]
        if int(np.prod(first)) * da.dtype.itemsize > DATES_PROBE_BYTES:
            return "calendar" in da.encoding or "calendar" in da.attrs
    return bool(_contains_datetime_like_objects(da.variable))


def _datetime_dims(obj: xr.DataArray | xr.Dataset) -> list[str]:
    """The dims whose own coordinate holds dates (:func:`is_dates`).

    A netCDF file's ``time`` decoded to datetimes keeps no ``units`` and often no ``axis``:
    ``dim="T"`` then found no dim (a new user's ``memchunk plan median ... --dim T``). Only the
    dims' own coordinates are looked at, by dtype: cf-xarray's guess by name would take any
    name that starts like an axis (``id`` for X).
    """
    return [str(d) for d in obj.dims if d in obj.coords and is_dates(obj.coords[d])]


def resolve_dim(obj: xr.DataArray | xr.Dataset, key: Hashable) -> str:
    """Return the dim of ``obj`` that ``key`` names.

    Parameters
    ----------
    obj
        The object the operator acts on.
    key
        A dim name, or a CF axis (``"X"``, ``"Y"``, ``"Z"``, ``"T"``), CF coordinate name
        (``"longitude"``, ``"time"``, ...) or standard name that cf-xarray finds from the
        coordinates' attributes.

    Raises
    ------
    DimensionError
        When no dim matches, or a CF key matches several.
    """
    if key in obj.dims:
        return str(key)
    matches = _cf_candidates(obj, str(key))
    if not matches and str(key) == "T":  # the CF time axis: decoded dates keep no attributes
        matches = _datetime_dims(obj)
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise DimensionError(
            f"{key!r} matches several dims through CF attributes ({', '.join(matches)}); "
            f"name the dim itself"
        )
    import cf_xarray  # noqa: F401

    axes = {k: v for k, v in obj.cf.axes.items() if v}
    cf_hint = f"; CF axes found: {axes}" if axes else "; no CF axes found in the attributes"
    raise DimensionError(f"no dim {key!r} in an object with dims {tuple(obj.dims)}{cf_hint}")


def has_dim(obj: xr.DataArray | xr.Dataset, key: Hashable) -> bool:
    """Whether ``obj`` has the dim ``key`` names (a name or a CF key, as :func:`resolve_dim`)."""
    try:
        resolve_dim(obj, key)
    except DimensionError:
        return False
    return True


def resolve_dims(
    obj: xr.DataArray | xr.Dataset, keys: Hashable | Iterable[Hashable] | None
) -> tuple[str, ...]:
    """Resolve one key, several keys, or None (every dim of ``obj``) to dim names."""
    if keys is None or keys is ...:
        return tuple(str(d) for d in obj.dims)
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        keys = [keys]
    dims = tuple(resolve_dim(obj, k) for k in keys)
    if len(set(dims)) != len(dims):
        raise DimensionError(f"dims {tuple(keys)} name the same dim twice: {dims}")
    return dims

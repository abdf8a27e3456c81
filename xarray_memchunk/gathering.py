"""A warning given where a lazy result is computed in one piece, not where it is written.

``plan.apply()`` knows where gathering its result into one worker (``.compute()``,
``.values``, ``.load()``) would go past a worker's pause line, but not whether the result will
be gathered or written. Warned at ``apply``, every ``result.memchunk.to_zarr(...)`` of a large
result came after a warning that said it did not apply then (two new users' trials flagged
it). Dask asks a collection for its ``__dask_postcompute__`` when it computes it
(``dask.compute``, ``Client.compute``, xarray's ``.compute()``, ``.values``, ``.load()``), not
when it stores it (``to_zarr``, ``dask.array.store``) or persists it: the result's Dask arrays
warn there, once per result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import xarray as xr

from .errors import ResultGatherWarning, warn_at_caller

__all__ = ["warn_when_gathered"]

#: Packages whose frames a warning given while Dask computes passes over, beside this one.
_LIBRARIES = ("xarray", "dask", "distributed")


def warn_when_gathered(result: xr.DataArray | xr.Dataset, message: str) -> None:
    """Give ``message`` as a :class:`ResultGatherWarning` when ``result`` is computed.

    Once for the result, at the first of its variables computed; not when it is written.
    """
    arrays = [result] if isinstance(result, xr.DataArray) else list(result.data_vars.values())
    warned: list[bool] = []
    for array in arrays:
        data = array.data
        if hasattr(data, "__dask_postcompute__") and hasattr(data, "__dict__"):
            data.__dask_postcompute__ = _warning_first(data.__dask_postcompute__, message, warned)


def _warning_first(
    postcompute: Callable[[], Any], message: str, warned: list[bool]
) -> Callable[[], Any]:
    """``postcompute``, which warns with ``message`` the first time any of its kind is called."""

    def warned_postcompute() -> Any:
        if not warned:
            warned.append(True)
            warn_at_caller(message, ResultGatherWarning, past=_LIBRARIES)
        return postcompute()

    return warned_postcompute

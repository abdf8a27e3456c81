"""The ``.memchunk`` accessor on :class:`xarray.Dataset` and :class:`xarray.DataArray`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xarray as xr

from . import api
from .io import overwrite_by_mode, refuse_delayed_write, safe_write
from .measure.runs import RunReport
from .memory_limits import Budget, resolve_budget
from .operators import Operator

__all__ = ["MemchunkAccessor"]


class MemchunkAccessor:
    """Memory-aware chunking for the operator that comes next.

    Examples
    --------
    >>> plan = ds.memchunk.plan("gst3d")      # doctest: +SKIP
    >>> dip = plan.apply()                    # doctest: +SKIP
    >>> dip = ds.memchunk.apply("gst3d")      # doctest: +SKIP
    """

    def __init__(self, obj: xr.Dataset | xr.DataArray) -> None:
        self._obj = obj

    def plan(
        self,
        op: str | Operator,
        *,
        memory_limit: int | str | None = None,
        budget: Budget | None = None,
        chunks: api.Chunks = None,
        measure: str = "auto",
        **op_kwargs: Any,
    ) -> api.Plan:
        """Plan chunks for ``op`` (measuring only what its notes say); ``plan.apply()`` runs it.

        See :func:`xarray_memchunk.api.plan`.
        """
        return api.plan(
            self._obj,
            op,
            memory_limit=memory_limit,
            budget=budget,
            chunks=chunks,
            measure=measure,
            **op_kwargs,
        )

    def apply(
        self,
        op: str | Operator,
        *,
        memory_limit: int | str | None = None,
        budget: Budget | None = None,
        chunks: api.Chunks = None,
        measure: str = "auto",
        record_plan: bool = False,
        **op_kwargs: Any,
    ) -> xr.Dataset | xr.DataArray:
        """Plan, rechunk per the plan, and return ``op``'s lazy result: ``plan(op).apply()``.

        See :func:`xarray_memchunk.apply`.
        """
        return api.apply(
            self._obj,
            op,
            memory_limit=memory_limit,
            budget=budget,
            chunks=chunks,
            measure=measure,
            record_plan=record_plan,
            **op_kwargs,
        )

    def report(self, learn: bool = True) -> RunReport:
        """Predicted against measured for the run of this object, a result of :meth:`apply`.

        See :func:`xarray_memchunk.api.report`.
        """
        return api.report(self._obj, learn)

    def to_zarr(
        self,
        store: str | os.PathLike,
        *,
        overwrite: bool = False,
        mode: str | None = None,
        compute: bool = True,
    ) -> Path:
        """Compute and write this (lazy) object to a Zarr store, atomically.

        Chunks are written as they are (the plan's, after :meth:`apply`), made uniform as Zarr
        requires: balanced plans such as (17, 17, 17, 17, 16, 16), which plain ``.to_zarr()``
        refuses, are written as (17, ..., 15). The store appears only once complete. An existing
        one is replaced only with ``overwrite=True`` (or xarray's ``mode="w"``), and only if it is
        a dataset (a Zarr store, a netCDF or HDF5 file), never another directory or file; a store
        that is a local file this object's data are read from (a netCDF file; a Zarr directory,
        zip file or ``file://`` URL), holds one, or lies inside one is refused. Appending to a
        store (``mode="a"``, ``"r+"``) is refused: it would not be atomic, and so is
        ``compute=False``: the write is run here, to its end, or removed. See
        :func:`xarray_memchunk.io.safe_write`.
        """
        refuse_delayed_write(compute, "to_zarr")
        overwrite = overwrite_by_mode(mode, overwrite, "to_zarr")
        return safe_write(self._obj, store, overwrite=overwrite, fmt="zarr", option=_REPLACE)

    def to_netcdf(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        mode: str | None = None,
        compute: bool = True,
    ) -> Path:
        """Compute and write this (lazy) object to a netCDF4 file, atomically, chunked as planned.

        See :meth:`to_zarr` for the guarantees; unlike xarray's ``to_netcdf``, an existing file
        is kept unless ``overwrite=True`` or ``mode="w"`` says to replace it.
        """
        refuse_delayed_write(compute, "to_netcdf")
        overwrite = overwrite_by_mode(mode, overwrite, "to_netcdf")
        return safe_write(self._obj, path, overwrite=overwrite, fmt="netcdf", option=_REPLACE)

    def budget(self, memory_limit: int | str | None = None) -> Budget:
        """The memory one task may use for this data, and where it came from.

        CuPy-backed data is budgeted against the GPU's memory; see :func:`resolve_budget`. A
        Dataset that mixes NumPy and CuPy variables is an error, as in :meth:`plan`.
        ``print()`` shows its arithmetic.

        A plan starts from this budget and may raise its baseline for what its operator and
        input leave in a worker between tasks: what calibrating a function left there, and
        the netCDF chunk caches of files a Dask graph reads. ``plan.budget`` is the plan's
        own, and ``plan.explain()`` says why it differs.
        """
        return resolve_budget(memory_limit, api.data_device(self._obj))


#: How a user of the accessor allows replacing an existing target, in messages.
_REPLACE = "overwrite=True (or mode='w')"


def register() -> None:
    """Register the accessor on Dataset and DataArray (idempotent)."""
    for cls in (xr.Dataset, xr.DataArray):
        if "memchunk" not in getattr(cls, "__dict__", {}):
            xr.register_dataset_accessor("memchunk")(MemchunkAccessor) if cls is xr.Dataset else (
                xr.register_dataarray_accessor("memchunk")(MemchunkAccessor)
            )

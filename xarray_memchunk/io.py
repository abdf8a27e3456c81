"""Open Zarr / netCDF inputs with their storage chunks, and write results safely.

Safe writes: the result goes to a hidden temporary path next to the target
(``.{name}.memchunk-tmp-{random}``) and is moved into place only once it is complete. An
existing target is never touched without ``overwrite=True``; with it, the old target is moved
aside, the new one moved in, and the old one removed only then. If the run fails (a killed
worker, Ctrl-C, a full disk) the temporary is removed when possible and the previous target is
untouched; a temporary left by a hard kill never has the target's name.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xarray as xr

from .errors import MemchunkError

__all__ = ["open_input", "output_format", "safe_write"]

_NETCDF_SUFFIXES = {".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5"}


def output_format(path: str | os.PathLike) -> str:
    """``"netcdf"`` for ``.nc``-like names, ``"zarr"`` otherwise."""
    return "netcdf" if Path(path).suffix.lower() in _NETCDF_SUFFIXES else "zarr"


def open_input(path: str | os.PathLike, variable: str | None = None) -> xr.Dataset | xr.DataArray:
    """Open a Zarr store or netCDF file lazily, keeping its storage chunks in the encoding.

    Raises
    ------
    MemchunkError
        When the path does not exist, is not a dataset, or lacks ``variable``.
    """
    path = Path(path)
    if not path.exists():
        raise MemchunkError(f"input {str(path)!r} does not exist")
    try:
        if path.is_dir():
            ds = xr.open_zarr(path, chunks={})
        else:
            ds = xr.open_dataset(path, chunks={})
    except Exception as exc:  # every backend has its own error types
        raise MemchunkError(
            f"cannot open {str(path)!r} as a Zarr store or netCDF file: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if variable is None:
        return ds
    if variable not in ds.data_vars:
        raise MemchunkError(
            f"no variable {variable!r} in {str(path)!r}; "
            f"variables: {', '.join(map(str, ds.data_vars))}"
        )
    return ds[variable]


def _temporary_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.memchunk-tmp-{uuid.uuid4().hex[:8]}")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def check_target(target: str | os.PathLike, overwrite: bool) -> Path:
    """Fail before any computation if ``target`` exists and ``overwrite`` is False."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise MemchunkError(
            f"output {str(target)!r} exists; pass overwrite=True (--overwrite) to replace it"
        )
    if not target.parent.exists():
        raise MemchunkError(f"output directory {str(target.parent)!r} does not exist")
    return target


def uniform_chunks(obj: xr.Dataset | xr.DataArray) -> dict[str, int]:
    """Longest chunk per dim: storage formats want equal chunks except the last."""
    return {str(d): max(c) for d, c in (obj.chunksizes or {}).items()}


def safe_write(
    obj: xr.Dataset | xr.DataArray,
    target: str | os.PathLike,
    *,
    overwrite: bool = False,
    compute: Callable[[Any], None] | None = None,
    fmt: str | None = None,
) -> Path:
    """Write ``obj`` to a Zarr store or netCDF file (by suffix), atomically.

    Parameters
    ----------
    obj
        The (lazy) result.
    target
        Output path; ``.nc`` and similar suffixes write netCDF4, anything else Zarr.
    overwrite
        Replace an existing target (only once the new one is complete).
    compute
        Called with the delayed write to run it (e.g. on a distributed client with a
        progress bar); ``dask.compute`` by default.
    fmt
        ``"zarr"`` or ``"netcdf"``; by the target's suffix when None.

    Returns
    -------
    Path
        The target.
    """
    import dask

    target = check_target(target, overwrite)
    ds = obj.to_dataset() if isinstance(obj, xr.DataArray) else obj
    chunks = uniform_chunks(ds)
    if chunks:
        ds = ds.chunk(chunks)
    tmp = _temporary_path(target)
    try:
        if (fmt or output_format(target)) == "netcdf":
            encoding = {
                name: {"chunksizes": tuple(chunks[d] for d in var.dims)}
                for name, var in ds.data_vars.items()
                if chunks and all(d in chunks for d in var.dims)
            }
            delayed = ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding, compute=False)
        else:
            for var in ds.variables.values():
                var.encoding.pop("chunks", None)
                var.encoding.pop("preferred_chunks", None)
            delayed = ds.to_zarr(tmp, mode="w-", compute=False, consolidated=True)
        (compute or dask.compute)(delayed)
        if target.exists():
            old = _temporary_path(target)
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    return target

"""Rechunk through disk: stage a graph's data in a temporary Zarr store when memory cannot.

A Dask graph whose chunks cut a dim the operator needs whole (climate data in one-step time
chunks, after any preprocessing) is rechunked inside the graph, and every task then waits for
all the source chunks it spans: a median over 1200 time steps of 100-step chunks holds all 12
of them at once. Where that cannot fit, the data is written once, as it comes, to a temporary
Zarr store (each write task holds one source chunk), and the operator's tasks then read their
planned blocks from it, as they read any file (bounded reads, nothing held for other tasks).
rechunker and Cubed stage intermediate data the same way.

The store lives in the staging directory: the dask config key ``memchunk.staging-dir``, else
dask's ``temporary-directory``, else the system's temporary directory. Where workers run on
other machines (a cluster that is not a ``LocalCluster``), only a configured
``memchunk.staging-dir`` is used: the workers must share it. Staging is refused when the
directory lacks room for the data. The store is removed when the Python process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

__all__ = [
    "STAGING_DIR_KEY",
    "WRITE_COPIES",
    "StagingSite",
    "disk_bandwidth",
    "stage",
    "staging_site",
]

#: The dask config key naming the directory staged data is written to.
STAGING_DIR_KEY = "memchunk.staging-dir"
#: Bytes a write task holds per byte of its source chunk: the chunk, its encoded copy and the
#: compressor's buffer (measured: 2.3 x a 64 MB float64 chunk written to Zarr with zstd).
WRITE_COPIES = 3.0
#: Room kept free on the staging disk beyond the data (fraction of the data).
DISK_MARGIN = 0.1
#: Bytes written to measure the staging disk's bandwidth.
PROBE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class StagingSite:
    """Where staged data would go, and whether it can.

    Attributes
    ----------
    directory
        The staging directory.
    free_bytes
        Free space there.
    bytes_per_second
        Measured write bandwidth (0 when not measured).
    refusal
        Why data cannot be staged there ("" when it can).
    """

    directory: Path
    free_bytes: int
    bytes_per_second: float
    refusal: str = ""

    def seconds(self, nbytes: float) -> float:
        """Estimated time to write and read back ``nbytes`` (0 where not measured)."""
        return 2 * nbytes / self.bytes_per_second if self.bytes_per_second else 0.0


def _directory(shared_only: bool) -> tuple[Path | None, str]:
    import dask

    configured = dask.config.get(STAGING_DIR_KEY, None)
    if configured:
        return Path(configured).expanduser(), f"{STAGING_DIR_KEY}"
    if shared_only:
        return None, (
            f"the workers run on other machines, so staged data needs a directory they all "
            f"share: set the dask config key {STAGING_DIR_KEY!r}"
        )
    temporary = dask.config.get("temporary-directory", None)
    if temporary:
        return Path(temporary).expanduser(), "dask's temporary-directory"
    return Path(tempfile.gettempdir()), "the system's temporary directory"


def _workers_are_local(client: Any) -> bool:
    if client is None:
        return True
    from distributed import LocalCluster

    return isinstance(getattr(client, "cluster", None), LocalCluster)


@lru_cache(maxsize=8)
def disk_bandwidth(directory: str) -> float:
    """Write bandwidth of ``directory`` in bytes per second, measured once per process.

    Writes :data:`PROBE_BYTES` to a temporary file there with ``fsync``, then removes it.
    """
    block = np.random.default_rng(0).integers(0, 255, PROBE_BYTES, dtype=np.uint8).tobytes()
    fd, path = tempfile.mkstemp(prefix=".memchunk-disk-probe-", dir=directory)
    try:
        start = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return PROBE_BYTES / max(time.perf_counter() - start, 1e-6)
    finally:
        Path(path).unlink(missing_ok=True)


def staging_site(nbytes: int, client: Any = None) -> StagingSite:
    """Where ``nbytes`` of staged data would be written, and whether they fit there."""
    directory, source = _directory(shared_only=not _workers_are_local(client))
    if directory is None:
        return StagingSite(Path(), 0, 0.0, source)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(directory).free
        bandwidth = disk_bandwidth(str(directory))
    except OSError as exc:
        return StagingSite(directory, 0, 0.0, f"{directory} ({source}) cannot be written: {exc}")
    needed = nbytes * (1 + DISK_MARGIN)
    if free < needed:
        return StagingSite(
            directory,
            free,
            bandwidth,
            f"{directory} ({source}) has {free / 1e9:.2f} GB free, and staging needs "
            f"{needed / 1e9:.2f} GB: free space there or set {STAGING_DIR_KEY!r}",
        )
    return StagingSite(directory, free, bandwidth)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def stage(da: xr.DataArray, site: StagingSite) -> xr.DataArray:
    """Write ``da`` to a new Zarr store in ``site`` now; ``da`` read from it.

    The store's chunks are ``da``'s longest per dim (Zarr wants equal chunks; monthly chunks of
    28 to 31 days become 31); the write runs on the active scheduler (a distributed client's
    workers, or threads), each task holding about one chunk. The store is removed when this
    process exits, and at once if the write fails.

    Raises
    ------
    MemchunkError
        When the write fails (the partial store is removed first).
    """
    from ..errors import MemchunkError

    path = site.directory / f"memchunk-staged-{uuid.uuid4().hex[:12]}.zarr"
    atexit.register(_remove, path)
    name = da.name if da.name is not None else "staged"
    variable = da.rename(name).reset_coords(drop=True).variable
    uniform = {d: max(c) for d, c in zip(da.dims, da.chunks, strict=True)}
    staged = xr.Dataset({str(name): variable.chunk(uniform)})
    for var in staged.variables.values():
        var.encoding.clear()
    try:
        staged.to_zarr(path, mode="w-", consolidated=False)
    except Exception as exc:
        _remove(path)
        raise MemchunkError(
            f"staging the data in {path.parent} failed ({type(exc).__name__}: {exc}); nothing "
            f"is left there. Set {STAGING_DIR_KEY!r} to another directory, or give the "
            f"workers more memory"
        ) from exc
    read = xr.open_zarr(path, consolidated=False, chunks={})[str(name)]
    result = da.copy(data=read.data)
    result.encoding = dict(read.encoding)
    return result

"""What reading netCDF4 files through a Dask graph leaves in a worker: HDF5 chunk caches.

netCDF-C gives each variable of each file it opens a cache of decompressed chunks (64 MiB by
default), and xarray keeps files open (up to its ``file_cache_maxsize`` option, 128 files). A
worker that has read a variable's chunks from a file keeps them until the file is closed.
Measured here: a graph over 4 yearly files (``tas`` and ``pr`` in zlib-compressed chunks of
183 x 48 x 96 float32, ``.where(mask)``, ``.chunk(time=100)``) grew a worker by 228 MiB at its
first task, and the growth stayed; with ``netCDF4.set_chunk_cache(0)`` in the worker, 10 MiB.
A ``groupby`` plan at 99% of its budget paused the worker in 2 of 3 runs.

memchunk's own reads of a file (:class:`~xarray_memchunk.operators.sources.BoundedReads`)
keep no chunk cache. A graph's reads are the user's: the plan counts what they keep in each
worker as part of its baseline (:func:`held_in_chunk_caches`), and its note says how to keep
none (:func:`chunk_cache_note`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

import xarray as xr

from .._dask_compat import from_array_source, graph_layers
from ..clusters import active_client
from ..units import format_size
from .sources import netcdf4_backend, netcdf4_variable

__all__ = ["ChunkCaches", "chunk_cache_note", "chunk_cache_remedy", "held_in_chunk_caches"]


def chunk_cache_remedy(in_this_process: bool) -> str:
    """How a user keeps the tasks from caching a graph's netCDF4 chunks.

    ``in_this_process``: the tasks run in this process (no cluster, or workers in it): the
    files are opened here when the dataset is, and a file keeps the cache size it was opened
    with, so the size is set before that.
    """
    if in_this_process:
        how = (
            "keep no netCDF chunk caches in this process: call netCDF4.set_chunk_cache(0) "
            "before opening the files (xr.open_mfdataset...; files opened before it keep "
            "their caches: open them again)"
        )
    else:
        how = (
            "keep no netCDF chunk caches in the workers: run client.run("
            "netCDF4.set_chunk_cache, 0) before they first read the files"
        )
    return (
        f"{how} (a file opened with chunks= and planned as it is, not through a graph, is "
        f"read by memchunk with none)"
    )


class ChunkCaches(NamedTuple):
    """The chunk caches a worker may still fill with what a graph reads from netCDF4 files.

    Attributes
    ----------
    nbytes
        Their total, for the worker that would fill the most: per variable of each file it
        has not opened yet, its decompressed chunks up to the cache size; over the
        ``file_cache_maxsize`` files that keep the most, which xarray keeps open. A file a
        worker has open already keeps its caches in the memory the worker holds now.
    files
        The files counted.
    variables
        The (file, variable) pairs counted.
    cache_bytes
        One variable's cache size in that worker.
    """

    nbytes: int
    files: int
    variables: int
    cache_bytes: int


class _Reader(NamedTuple):
    """Where tasks run: its chunk cache size, the netCDF4 files it has open, its memory."""

    cache_bytes: int
    open_files: frozenset[str]
    memory: int  # resident bytes now; 0 where not asked (this process, with no client)
    pid: int


def _readers() -> list[_Reader]:
    """The active Dask client's workers, or this process where there is none.

    This process counts no file as open: files a graph's input was opened from are open here
    for their metadata, their caches empty. So does a worker in this process
    (``LocalCluster(processes=False)``), which shares them.
    """
    client = active_client()
    if client is not None:
        answers = client.run(_as_reader, on_error="ignore").values()
        readers = [a for a in answers if isinstance(a, _Reader)]
        if readers:
            here = os.getpid()
            return [r._replace(open_files=frozenset()) if r.pid == here else r for r in readers]
    return [_Reader(_chunk_cache_bytes(), frozenset(), 0, os.getpid())]


def _as_reader() -> _Reader:
    """The process it runs in (each worker) as a :class:`_Reader`."""
    import psutil
    from xarray.backends.file_manager import FILE_CACHE

    paths = set()
    for opened in list(FILE_CACHE.values()):
        filepath = getattr(opened, "filepath", None)  # a netCDF4.Dataset
        if callable(filepath):
            with contextlib.suppress(Exception):  # closed meanwhile, or not a netCDF4 file
                paths.add(os.path.realpath(filepath()))
    memory = int(psutil.Process().memory_info().rss)
    return _Reader(_chunk_cache_bytes(), frozenset(paths), memory, os.getpid())


def _chunk_cache_bytes() -> int:
    """``netCDF4``'s chunk cache size for files opened next in this process; 0 without it."""
    try:
        import netCDF4
    except ImportError:
        return 0
    return int(netCDF4.get_chunk_cache()[0])


def held_in_chunk_caches(arrays: Iterable[xr.DataArray], idle_bytes: int) -> ChunkCaches:
    """What the caches of the files the graphs of ``arrays`` read add to the workers' baseline.

    Every netCDF4 variable a graph reads through ``dask.array.from_array`` (as
    ``xarray.open_dataset`` and ``open_mfdataset`` make them) counts once per file: its chunks
    read whole, up to the cache size of the worker (:func:`netCDF4.get_chunk_cache` there); a
    contiguous variable, or one whose chunk is larger than the cache, keeps none. A file a
    worker has open counts no more: its caches are in the memory the worker holds now.

    A budget's baseline is already the memory of its fullest worker, where that is more than
    ``idle_bytes`` (the configured baseline). So each worker adds its caches to what it holds
    (at least ``idle_bytes``), and what the fullest of those sums is above the fullest worker
    now is returned: a worker that holds a file's caches already and a fresh one that will
    fill them are not both counted.
    """
    backends: dict[tuple[str, str], Any] = {}  # per (file, variable)
    for da in arrays:
        data = da.data
        if not hasattr(data, "__dask_graph__"):
            continue
        graph = data.__dask_graph__()
        for name in graph_layers(graph):
            backend = netcdf4_backend(from_array_source(graph, name))
            if backend is not None:
                path = os.path.realpath(backend.datastore._filename)
                backends.setdefault((path, str(backend.variable_name)), backend)
    if not backends:
        return ChunkCaches(0, 0, 0, 0)
    layouts = {key: _layout(backend) for key, backend in backends.items()}
    readers = _readers()
    held = [max(idle_bytes, reader.memory) for reader in readers]
    fullest = max(held)
    filled = [_filled_by(reader, layouts) for reader in readers]
    added = [
        c._replace(nbytes=max(0, h + c.nbytes - fullest)) for h, c in zip(held, filled, strict=True)
    ]
    return max(added, key=lambda c: c.nbytes)


def _filled_by(reader: _Reader, layouts: dict[tuple[str, str], tuple[int, int]]) -> ChunkCaches:
    """What ``reader`` would keep once it has read every variable of ``layouts``."""
    per_file: dict[str, int] = {}
    cached: dict[tuple[str, str], int] = {}
    for (path, variable), (chunk_bytes, count) in layouts.items():
        if path in reader.open_files or not chunk_bytes or chunk_bytes > reader.cache_bytes:
            continue  # open: held already; contiguous or too large: HDF5 caches none of it
        cached[path, variable] = min(reader.cache_bytes, count * chunk_bytes)
        per_file[path] = per_file.get(path, 0) + cached[path, variable]
    ranked = sorted(per_file, key=per_file.__getitem__, reverse=True)
    kept = set(ranked[: int(xr.get_options()["file_cache_maxsize"])])
    variables = sum(1 for (path, _) in cached if path in kept)
    return ChunkCaches(sum(per_file[p] for p in kept), len(kept), variables, reader.cache_bytes)


def _layout(backend: Any) -> tuple[int, int]:
    """A netCDF4 variable's bytes per storage chunk and number of chunks; (0, 0) contiguous."""
    with netcdf4_variable(backend) as variable:
        chunking = variable.chunking()
    if not isinstance(chunking, list):  # "contiguous": no chunks to cache
        return 0, 0
    count = math.prod(-(-n // c) for n, c in zip(variable.shape, chunking, strict=True))
    return math.prod(chunking) * variable.dtype.itemsize, count


def chunk_cache_note(caches: ChunkCaches, in_this_process: bool = False) -> str:
    """The plan's note on what a worker keeps in chunk caches, and how to keep none.

    ``in_this_process``: the tasks run in this process (no cluster, or workers in it), which
    keeps them.
    """
    holder = "this process" if in_this_process else "a worker"
    counted = "in this process's baseline" if in_this_process else "in each worker's baseline"
    return (
        f"netCDF chunk caches: the input's graph reads chunked netCDF4 variables "
        f"({caches.variables}, in {caches.files} file(s)), and {holder} keeps up to "
        f"{format_size(caches.cache_bytes)} of each one's decompressed chunks while xarray "
        f"keeps the file open: {format_size(caches.nbytes)} counted {counted}. To "
        f"{chunk_cache_remedy(in_this_process)}"
    )

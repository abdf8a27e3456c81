"""Where a variable's data comes from, and how each task of ``apply`` gets its block.

Three kinds of input (:class:`~xarray_memchunk.planning.footprint.InputKind`):

- ``FILE``: a variable exactly as ``xarray.open_dataset(..., chunks=...)`` /
  ``xarray.open_zarr`` made it, a Dask array whose every chunk is read from xarray's lazily
  indexed backend array; or as ``xarray.open_mfdataset(..., chunks=...)`` made it, such
  arrays of several files concatenated along one dim (:class:`ConcatenatedReads`). ``apply``
  reads the planned chunks (halo included) straight from the file(s) instead of rechunking or
  overlapping inside the graph, so no worker holds chunks for other tasks.
- ``GRAPH``: any other Dask array; rechunks and halos happen inside the graph.
- ``MEMORY``: NumPy data, cut into the planned chunks by ``apply``.

A file read with a halo (:func:`map_blocks_with_halo`) gives the same values as
``dask.array.map_overlap(..., boundary="none")``: interior sides of a block get ``depth``
neighbouring elements, sides on the array's edge none.

Reads are bounded (:class:`BoundedReads`): a region is read in groups of storage chunks that
touch at most :data:`~xarray_memchunk.planning.footprint.READ_GROUP_BYTES` of storage, since
Zarr decodes up to 10 chunks at once, each beside its compressed bytes (measured: reading one
whole 64 MB chunk peaks at 185 MB, two at 290 MB). A variable stored without chunks
(contiguous netCDF: ``encoding["contiguous"]``) has no storage chunks: any range is read as it
is, in groups of at most ``READ_GROUP_BYTES`` (measured: reading a 94.6 MB range whole peaks
at 2.0 x the range, in 32 MiB groups at 1.7 x). So is a netCDF4 variable whose storage chunks
have no HDF5 filter (no compression, shuffle or checksum): with no chunk cache, HDF5 copies the
range straight from the file (measured: reading one element of a 128 MiB uncompressed chunk held
0.3 MiB, of the same chunk compressed with zlib 256 MiB; :func:`reads_own_range`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from .._dask_compat import (
    alias_target,
    array_meta,
    first_task_arguments,
    from_array_source,
    graph_layers,
    layer_dependencies,
    layer_tasks,
)
from ..planning.footprint import READ_GROUP_BYTES, InputKind
from ..planning.problem import Halo, halo_sides, widest_halo
from .arrays import is_cupy
from .graph_values import call_with, once_in_graph
from .zarr_reads import direct_reader, with_direct_zarr_reads

__all__ = [
    "BoundedReads",
    "ConcatenatedReads",
    "backend_array",
    "netcdf4_backend",
    "netcdf4_variable",
    "chunk_in_memory",
    "in_memory_data",
    "contiguous_storage",
    "device_of",
    "file_backend",
    "input_kind",
    "lazy_file_variable",
    "map_blocks_with_halo",
    "file_reads",
    "read_chunked",
    "read_through_dask",
    "reads_own_range",
    "reads_serialized",
    "source_chunks",
    "source_files",
    "storage_chunks",
]


def _is_dask(data: Any) -> bool:
    return hasattr(data, "dask") and hasattr(data, "chunks")


#: Name prefix of the Dask arrays :func:`read_chunked` makes.
READ_PREFIX = "memchunk-read-"
#: Name prefix of the Dask arrays :func:`chunk_in_memory` makes.
MEMORY_PREFIX = "memchunk-in-memory-"
#: Chunk cache a netCDF4 variable keeps between bounded reads. netCDF-C keeps 64 MiB per
#: variable of each open file, and xarray keeps files open: reading one 59 MB block from 5
#: one-day-chunked files grew a process by 404 MB, the block included (69 MB with no cache,
#: and no slower).
NETCDF4_CHUNK_CACHE_BYTES = 0


def file_backend(data: Any) -> Any | None:
    """The backend array a Dask array reads from, when it is nothing but reads from files.

    That is the graph ``dask.array.from_array`` makes of xarray's lazily indexed array: two
    layers, ``original-...`` holding the array and the getter tasks (as ``xarray.open_dataset``
    makes it), or the one layer of :func:`read_chunked`'s getters with the array inlined; or
    the graph ``xarray.open_mfdataset`` makes: one ``concatenate`` layer over such pairs, one
    per file, along one axis (a :class:`ConcatenatedReads` of their backend arrays). Returns
    None for any other array (computed, selected, rechunked, preprocessed, or NumPy data).
    What it relies on in Dask's graphs is in :mod:`xarray_memchunk._dask_compat`.
    """
    if not _is_dask(data):
        return None
    graph = data.__dask_graph__()
    layers = graph_layers(graph)
    if data.name not in layers:
        return None
    if len(layers) == 1 and str(data.name).startswith(READ_PREFIX):
        args = first_task_arguments(graph, data.name)
        return next((a for a in args if isinstance(a, BoundedReads | ConcatenatedReads)), None)
    if len(layers) == 2:
        return _one_file(graph, data.name, tuple(data.shape))
    return _concatenated_files(graph, data.name, tuple(data.shape), data.chunks)


def source_files(obj: xr.Dataset | xr.DataArray) -> set[str]:
    """The local files and Zarr stores the Dask graphs of ``obj``'s variables read.

    Found in each graph layer's arrays, however the reads were made: ``xarray.open_dataset``,
    ``open_zarr`` and ``open_mfdataset``'s backend arrays (the file a netCDF store opened, the
    directory of a local Zarr store, a zip file's ``ZipStore``, a ``file://`` URL's
    ``FsspecStore``), and memchunk's own reads straight from a file
    (:class:`BoundedReads`, :class:`ConcatenatedReads`), which carry no ``encoding["source"]``:
    a result of ``apply`` on a Zarr store reads it so, and a SEG-Y file's
    :class:`~xarray_memchunk.seismic.segy.SegyArray`. Paths are as the backends hold them.
    """
    variables = obj.variables.values() if isinstance(obj, xr.Dataset) else [obj.variable]
    found: set[str] = set()
    for variable in variables:
        if not _is_dask(variable.data):
            continue
        graph = variable.data.__dask_graph__()
        for name in graph_layers(graph):
            # the reads are layers of no dependencies (memchunk's own, with the array inlined;
            # from_array's ``original-`` one) or getters over an ``original-`` one: only those
            # are read, since reading a layer materializes all its tasks
            source = from_array_source(graph, name)
            if source is None and layer_dependencies(graph, name):
                continue
            try:
                held = [source] if source is not None else first_task_arguments(graph, name)
            except (StopIteration, TypeError, AttributeError):  # a layer of no tasks
                continue
            for value in held:
                found.update(_local_paths(value))
    return found


def _local_paths(value: Any, depth: int = 0) -> Iterator[str]:
    """The local paths an array read from files holds, through its wrappers."""
    if value is None or depth > 12 or isinstance(value, np.ndarray | str | bytes | int | float):
        return
    if isinstance(value, list | tuple):
        for item in value:
            yield from _local_paths(item, depth + 1)
        return
    yield from _store_paths(getattr(value, "store", None))  # a zarr array's store
    filename = getattr(value, "_filename", None)  # xarray's netCDF4 and h5netcdf data stores
    if isinstance(filename, str | os.PathLike):
        yield str(filename)
    segy = getattr(getattr(value, "geometry", None), "path", None)  # a SEG-Y file's SegyArray
    if isinstance(segy, str | os.PathLike):
        yield str(segy)
    opened = getattr(getattr(value, "_manager", None), "_args", None)  # its scipy data store
    if opened and isinstance(opened[0], str | os.PathLike):
        yield str(opened[0])
    for attribute in ("array", "_array", "datastore", "parts", "direct"):
        inner = getattr(value, attribute, None)
        if inner is not None and inner is not value:
            yield from _local_paths(inner, depth + 1)


def _store_paths(store: Any) -> Iterator[str]:
    """The local path of a Zarr store, where it has one.

    A directory (``LocalStore``), a zip file (``ZipStore``), or an ``FsspecStore`` on the local
    file system (``file://`` URLs); nothing for a store elsewhere or in memory.
    """
    if store is None:
        return
    root = getattr(store, "root", None)
    if root is not None:
        yield str(root)
        return
    path = getattr(store, "path", None)
    if not isinstance(path, str | os.PathLike):
        return
    fs = getattr(store, "fs", None)
    if fs is not None:  # fsspec: only its local file system's paths are files here
        protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        if not {"file", "local"} & set(protocol):
            return
    if os.path.exists(path):
        yield str(path)


def _one_file(graph: Any, name: str, shape: tuple[int, ...]) -> Any | None:
    """The backend array of layer ``name`` when it is the getters of one ``original-`` array."""
    backend = from_array_source(graph, name)
    if backend is None or isinstance(backend, np.ndarray):
        return None
    if backend_array(backend) is None or tuple(getattr(backend, "shape", ())) != shape:
        return None
    return backend


def backend_array(array: Any) -> Any | None:
    """The backend's own array under xarray's lazily indexed wrappers, or None."""
    from xarray.backends.common import BackendArray

    while array is not None and not isinstance(array, BackendArray):
        array = getattr(array, "array", None)
    return array


def netcdf4_backend(array: Any) -> Any | None:
    """The netCDF4 backend array (xarray's) under ``array``'s lazy wrappers, or None."""
    from xarray.backends.netCDF4_ import NetCDF4ArrayWrapper

    inner = backend_array(array) if array is not None else None
    return inner if isinstance(inner, NetCDF4ArrayWrapper) else None


@contextlib.contextmanager
def netcdf4_variable(backend: Any) -> Iterator[Any]:
    """The ``netCDF4.Variable`` of a netCDF4 backend array, under its file's lock.

    As xarray's own reads: HDF5 is not thread-safe.
    """
    with backend.datastore.lock:
        yield backend.get_array(needs_lock=False)


def _drop_chunk_cache(array: Any) -> None:
    """Keep at most :data:`NETCDF4_CHUNK_CACHE_BYTES` of a netCDF4 variable's chunks cached."""
    backend = netcdf4_backend(array)
    if backend is not None:
        with netcdf4_variable(backend) as variable:
            variable.set_var_chunk_cache(size=NETCDF4_CHUNK_CACHE_BYTES)


def _concatenated_files(
    graph: Any, name: str, shape: tuple[int, ...], chunks: tuple[tuple[int, ...], ...]
) -> ConcatenatedReads | None:
    """The files of layer ``name`` when it concatenates one-file arrays along one axis."""
    parts = layer_dependencies(graph, name)
    if len(parts) < 2 or len(graph_layers(graph)) != 1 + 2 * len(parts):
        return None
    blocks = {}
    for key, value in layer_tasks(graph, name).items():
        target = alias_target(value)
        if not isinstance(target, tuple) or target[0] not in parts:
            return None
        blocks[key[1:]] = (target[0], target[1:])
    layout = _concatenation_layout(blocks, len(shape))
    if layout is None:
        return None
    axis, starts = layout
    bounds = [*starts.values(), len(chunks[axis])]
    backends = []
    for part, first, last in zip(starts, bounds[:-1], bounds[1:], strict=True):
        length = sum(chunks[axis][first:last])
        backends.append(_one_file(graph, part, (*shape[:axis], length, *shape[axis + 1 :])))
    if any(b is None for b in backends):
        return None
    return ConcatenatedReads(backends, axis)


def _concatenation_layout(
    blocks: Mapping[tuple[int, ...], tuple[str, tuple[int, ...]]], ndim: int
) -> tuple[int, dict[str, int]] | None:
    """The axis blocks are concatenated along, and each part's first block along it, in order.

    ``blocks`` maps each block index to the part and the part's block index it takes. None
    unless every part is one run of blocks, taken whole and in order, along one axis.
    """
    moved = {a for idx, (_, own) in blocks.items() for a in range(ndim) if idx[a] != own[a]}
    if len(moved) != 1:
        return None
    (axis,) = moved
    starts: dict[str, int] = {}
    current = None
    for idx in sorted(blocks, key=lambda i: i[axis]):
        part, own = blocks[idx]
        if part != current:
            if part in starts:  # a part taken in two runs
                return None
            starts[part], current = idx[axis], part
        if own != (*idx[:axis], idx[axis] - starts[part], *idx[axis + 1 :]):
            return None
    return axis, starts


def lazy_file_variable(variable: xr.Variable) -> bool:
    """Whether xarray reads ``variable`` from a file lazily, without Dask.

    ``xr.open_dataset(path)`` without ``chunks`` holds such variables: asking for their
    ``.data`` reads them whole (and xarray keeps them in memory after).
    """
    from xarray.core.indexing import ExplicitlyIndexed

    return isinstance(variable._data, ExplicitlyIndexed)


def read_through_dask(obj: xr.DataArray | xr.Dataset) -> xr.DataArray | xr.Dataset:
    """``obj`` with each data variable read lazily without Dask as one Dask chunk of its file.

    Planning needs a variable's storage and its data's kind, and ``.data`` of a variable
    opened without ``chunks`` reads the file whole: planning a median of a 606 MB netCDF
    variable took 606 MB more memory before it changed. Such a variable becomes one Dask
    chunk read from the file (``Variable.chunk({})``, as ``open_dataset(path, chunks={})``
    opens it; nothing is read), which :func:`file_backend` sees as reads from the file, so
    the plan's tasks read their blocks straight from it. Coordinates stay as they are.
    """
    if not isinstance(obj, xr.DataArray | xr.Dataset):  # the caller says what is wrong
        return obj
    if isinstance(obj, xr.DataArray):
        if not lazy_file_variable(obj.variable):
            return obj
        return obj.copy(deep=False, data=obj.variable.chunk({}).data)
    lazy = {
        n: v.variable.chunk({}) for n, v in obj.data_vars.items() if lazy_file_variable(v.variable)
    }
    return obj.assign(lazy) if lazy else obj


def device_of(da: xr.DataArray) -> str:
    """``"gpu"`` when ``da`` holds CuPy data (or dask chunks of CuPy), else ``"cpu"``.

    A file variable read without Dask is on the CPU: its data are not read to say so.
    """
    if lazy_file_variable(da.variable):
        return "cpu"
    data = da.data
    return "gpu" if is_cupy(array_meta(data)) else "cpu"


def input_kind(da: xr.DataArray) -> InputKind:
    """Classify ``da``'s data: read from a file, produced by a Dask graph, or in memory."""
    if not _is_dask(da.data):
        return InputKind.MEMORY
    return InputKind.FILE if file_backend(da.data) is not None else InputKind.GRAPH


def contiguous_storage(da: xr.DataArray) -> bool:
    """Whether ``da`` is read from a file that stores it without chunks (contiguous netCDF).

    Any range of such a variable is read as it is: it has no storage chunks to decode whole.
    """
    return da.encoding.get("contiguous") is True and file_backend(da.data) is not None


#: ``encoding`` keys of the netCDF4 backend that name an HDF5 filter: a chunk stored through
#: one is decoded whole, whatever part of it is read.
HDF5_FILTERS = ("zlib", "szip", "zstd", "bzip2", "blosc", "shuffle", "fletcher32")


def reads_own_range(da: xr.DataArray) -> bool:
    """Whether reading any range of ``da`` touches that range only, decoding no whole chunk.

    True for a variable stored without chunks (:func:`contiguous_storage`), and for one read
    with the netCDF4 backend whose storage chunks have no HDF5 filter: :class:`BoundedReads`
    keeps no chunk cache, so HDF5 copies the range straight from the file into the block.
    """
    if contiguous_storage(da):
        return True
    unfiltered = not any(da.encoding.get(key) for key in HDF5_FILTERS)
    return unfiltered and _netcdf4_arrays(da) is not None


def reads_serialized(da: xr.DataArray) -> bool:
    """Whether a worker's reads of ``da`` decode one at a time, whatever its threads.

    True for a variable read with the netCDF4 backend under xarray's lock (its default, unless
    opened with ``lock=False``): HDF5 is not thread-safe, so each read, decompression included,
    holds a lock shared by every thread of the process.
    """
    from xarray.backends.locks import DummyLock

    arrays = _netcdf4_arrays(da)
    return arrays is not None and not any(isinstance(a.datastore.lock, DummyLock) for a in arrays)


def _netcdf4_arrays(da: xr.DataArray) -> list[Any] | None:
    """The netCDF4 backend array of each file ``da`` is read from; None unless all are such."""
    backend = file_backend(da.data)
    if backend is None:
        return None
    parts = backend.parts if isinstance(backend, ConcatenatedReads) else [backend]
    arrays = [netcdf4_backend(part) for part in parts]
    return arrays if all(a is not None for a in arrays) else None


def storage_chunks(da: xr.DataArray) -> dict[str, int | None]:
    """Storage chunk length per dim: on-disk chunks from the encoding, else the Dask chunks.

    None for a dim with neither (NumPy data), and for every dim of a variable stored without
    chunks (:func:`contiguous_storage`).
    """
    if contiguous_storage(da):
        return dict.fromkeys(map(str, da.dims))
    preferred = da.encoding.get("preferred_chunks") or {}
    on_disk = da.encoding.get("chunks") or da.encoding.get("chunksizes")
    result: dict[str, int | None] = {}
    for axis, dim in enumerate(da.dims):
        length = preferred.get(dim)
        if length is None and on_disk is not None and len(on_disk) == da.ndim:
            length = on_disk[axis]
        if length is None and da.chunks is not None:
            length = max(da.chunks[axis])
        result[str(dim)] = int(length) if length else None
    return result


def file_chunks(da: xr.DataArray) -> dict[str, int]:
    """Storage chunk length per dim of a variable read from a file (its length where unknown).

    One element per dim for a variable stored without chunks: any range is whole storage.
    """
    if contiguous_storage(da):
        return dict.fromkeys(map(str, da.dims), 1)
    return {
        d: min(length or n, n)
        for (d, length), n in zip(storage_chunks(da).items(), da.shape, strict=True)
    }


def source_chunks(da: xr.DataArray) -> dict[str, int]:
    """Longest chunk per dim as the data comes.

    Storage chunks for data read from a file, Dask chunks for a graph, the dim's length for
    NumPy data.
    """
    if da.chunks is None:
        return {str(d): int(n) for d, n in da.sizes.items()}
    if file_backend(da.data) is not None:
        return file_chunks(da)
    return {str(d): int(max(c)) for d, c in zip(da.dims, da.chunks, strict=True)}


class BoundedReads:
    """A file-backed array whose reads decode at most ``max_bytes`` of storage at once.

    A netCDF4 variable is read with no chunk cache (:data:`NETCDF4_CHUNK_CACHE_BYTES`), so
    that nothing of a read stays in the worker once it ends. A local Zarr array of a common
    layout is read chunk file by chunk file, each decoded straight into the block
    (:mod:`~xarray_memchunk.operators.zarr_reads`): one storage chunk's bytes at a time, where
    zarr decodes up to 10 at once.

    Parameters
    ----------
    array
        xarray's lazily indexed backend array (what the ``original-`` key of a variable
        opened with ``chunks=`` holds).
    storage
        Storage chunk length per axis.
    max_bytes
        Storage bytes one read may touch; a larger region is read in groups of storage chunks
        along its first axis that spans several, recursively.
    """

    def __init__(self, array: Any, storage: tuple[int, ...], max_bytes: int = READ_GROUP_BYTES):
        self.array = with_direct_zarr_reads(array)
        self.direct = direct_reader(self.array)
        self.storage = tuple(int(c) for c in storage)
        self.max_bytes = int(max_bytes)
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        _drop_chunk_cache(self.array)
        return self._read(_region(key, self.shape))

    def read_into(self, key: tuple[slice, ...], out: np.ndarray) -> None:
        """Read ``key`` into ``out`` (of its shape), with no block of its size on the side."""
        _drop_chunk_cache(self.array)
        self._read(_region(key, self.shape), out)

    def _touched(self, region: tuple[slice, ...]) -> list[tuple[int, int]]:
        """First and last storage chunk index the region touches, per axis."""
        return [
            (s.start // c, max(s.start, s.stop - 1) // c)
            for s, c in zip(region, self.storage, strict=True)
        ]

    def _read(
        self, region: tuple[slice, ...], out: np.ndarray | None = None, direct: bool = True
    ) -> np.ndarray:
        shape = _extent(region)
        direct = (
            direct
            and self.direct is not None
            and (out is None or (out.dtype == self.dtype and out.shape == shape))
        )
        if direct and out is None:  # a raw chunk of a staged store: its file, mapped
            mapped = self.direct.mapped(region)
            if mapped is not None:
                return mapped
        if direct:  # one storage chunk at a time, into the block itself
            out = np.empty(shape, self.dtype) if out is None else out
            if not out.size or self.direct.read_into(region, out):
                return out
            # a storage chunk has no file: zarr reads the region into the same block
        touched = self._touched(region)
        storage_bytes = self.dtype.itemsize * int(
            np.prod(
                [
                    (last - first + 1) * c
                    for (first, last), c in zip(touched, self.storage, strict=True)
                ]
            )
        )
        split = next((a for a, (first, last) in enumerate(touched) if last > first), None)
        if storage_bytes <= self.max_bytes or split is None:
            block = np.asarray(self.array[region])
            if out is None:
                return block
            out[...] = block
            return out
        first, last = touched[split]
        per_chunk = storage_bytes // (last - first + 1)
        group = max(1, self.max_bytes // max(1, per_chunk))
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        axis_region = region[split]
        c = self.storage[split]
        for k in range(first, last + 1, group):
            lo = max(axis_region.start, k * c)
            hi = min(axis_region.stop, (k + group) * c)
            sub = (*region[:split], slice(lo, hi), *region[split + 1 :])
            where = (slice(None),) * split + (
                slice(lo - axis_region.start, hi - axis_region.start),
            )
            self._read(sub, out[where], direct=False)  # no direct reads, or one failed
        return out


class ConcatenatedReads:
    """Several files' arrays read as one, concatenated along ``axis`` (``open_mfdataset``).

    A region within one file is that file's read; a region across files is filled file by
    file, so a read holds the block and one file's read at once, as a read from one file does.

    Parameters
    ----------
    parts
        Each file's array (xarray's lazily indexed backend array, or a :class:`BoundedReads`
        of it), in order; their shapes differ along ``axis`` only.
    axis
        The axis they are concatenated along.
    """

    def __init__(self, parts: Sequence[Any], axis: int):
        self.parts = list(parts)
        self.axis = int(axis)
        lengths = [int(p.shape[axis]) for p in self.parts]
        self.offsets = np.cumsum([0, *lengths]).tolist()
        first = self.parts[0]
        self.shape = (*first.shape[:axis], self.offsets[-1], *first.shape[axis + 1 :])
        self.dtype = np.dtype(first.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        region = _region(key, self.shape)
        pieces = list(self._pieces(region[self.axis]))
        if len(pieces) == 1:
            ((part, local, _),) = pieces
            return np.asarray(part[self._within(region, local)])
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=self.dtype)
        for part, local, where in pieces:
            target = out[(slice(None),) * self.axis + (where,)]
            _read_into(part, self._within(region, local), target)
        return out

    def _pieces(self, span: slice) -> Iterator[tuple[Any, slice, slice]]:
        """Per file the span touches: the file's array, its range, and where it goes."""
        for part, lo, hi in zip(self.parts, self.offsets[:-1], self.offsets[1:], strict=True):
            start, stop = max(span.start, lo), min(span.stop, hi)
            if start < stop:
                yield (
                    part,
                    slice(start - lo, stop - lo),
                    slice(start - span.start, stop - span.start),
                )

    def _within(self, region: tuple[slice, ...], local: slice) -> tuple[slice, ...]:
        return (*region[: self.axis], local, *region[self.axis + 1 :])


def _region(key: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """``key`` (slices, as Dask's getters pass them) as slices with a start and a stop."""
    return tuple(slice(*k.indices(n)[:2]) for k, n in zip(key, shape, strict=True))


def _extent(region: tuple[slice, ...]) -> tuple[int, ...]:
    """The shape of ``region`` (slices with a start and a stop)."""
    return tuple(max(0, s.stop - s.start) for s in region)


def _read_into(array: Any, region: tuple[slice, ...], out: np.ndarray) -> None:
    """Read ``region`` of ``array`` into ``out``, without a copy of it where ``array`` can."""
    if isinstance(array, BoundedReads):
        array.read_into(region, out)
    else:
        out[...] = np.asarray(array[region])


def bounded_reads(backend: Any, storage: tuple[int, ...]) -> BoundedReads | ConcatenatedReads:
    """``backend`` read in bounded groups of its ``storage`` chunks (each file's, if several)."""
    if isinstance(backend, BoundedReads):
        return backend
    if isinstance(backend, ConcatenatedReads):
        return ConcatenatedReads([bounded_reads(p, storage) for p in backend.parts], backend.axis)
    return BoundedReads(backend, storage)


def file_reads(da: xr.DataArray) -> BoundedReads | ConcatenatedReads:
    """The bounded reads of ``da``'s file (each file's, if several), in its storage chunks."""
    backend = file_backend(da.data)
    if backend is None:
        raise ValueError("file_reads needs a variable read straight from a file")
    storage = file_chunks(da)
    return bounded_reads(backend, tuple(storage[str(d)] for d in da.dims))


def read_chunked(
    da: xr.DataArray,
    chunks: Mapping[str, tuple[int, ...]],
    reads: BoundedReads | ConcatenatedReads | None = None,
) -> xr.DataArray:
    """``da`` (read from a file) as a Dask array whose tasks read the given chunks from the file.

    Reads are bounded (:class:`BoundedReads`): ``reads``, the caller's :func:`file_reads` of
    ``da``, else made here.
    """
    import dask.array
    from dask.base import tokenize

    backend = file_reads(da) if reads is None else reads
    dask_chunks = tuple(tuple(chunks[str(d)]) for d in da.dims)
    name = f"{READ_PREFIX}{tokenize(da.data.name, dask_chunks)}"
    # inlined, each read is a root task of its own, which Dask fuses into the task that uses
    # the block; with a shared ``original-`` key it stays a task apart, and a worker may read
    # the next block before the current one is used (one more block held)
    data = dask.array.from_array(
        backend, chunks=dask_chunks, name=name, meta=np.ndarray, inline_array=True
    )
    return da.copy(data=data)


def chunk_in_memory(
    da: xr.DataArray, chunks: Mapping[str, tuple[int, ...]], *, copy: bool
) -> xr.DataArray:
    """``da`` (NumPy or CuPy data in memory) as a Dask array of the given chunks.

    ``DataArray.chunk`` copies the whole array first (Dask 2026.8's
    ``dask.array.from_array`` copies anything array-like) and hashes it for the graph's name:
    a 2.42 GB float32 array took 5.8 s to copy and 1.9 s to hash, and the copy doubles what
    the caller's process holds, which a plan on the threaded scheduler counts as free memory.
    Here the name is random, as ``from_array(..., name=False)`` makes it, and the blocks are
    read-only views of the array, or, with ``copy``, copies of them: a user's function may
    write into its block, as it may under Dask, and must not write into the caller's array
    (the built-in operators never do). A task sees a change made to the array before it runs.
    """
    import uuid

    import dask.array
    from dask.array.core import normalize_chunks, slices_from_chunks

    data = da.data
    if data.ndim == 0:  # nothing to cut
        return da.chunk()
    dask_chunks = normalize_chunks(
        tuple(tuple(chunks[str(d)]) for d in da.dims), data.shape, dtype=data.dtype
    )
    name = f"{MEMORY_PREFIX}{uuid.uuid4().hex}"
    keys = [(name, *index) for index in np.ndindex(*(len(c) for c in dask_chunks))]
    blocks = [_block(data, region, copy) for region in slices_from_chunks(dask_chunks)]
    meta = data[(slice(0, 0),) * data.ndim]
    array = dask.array.Array(dict(zip(keys, blocks, strict=True)), name, dask_chunks, meta=meta)
    return da.copy(deep=False, data=array)


def _block(data: Any, region: tuple[slice, ...], copy: bool) -> Any:
    """``data[region]``: a copy, or a view that cannot be written through (NumPy's)."""
    block = data[region]
    if copy:
        return block.copy()
    if isinstance(block, np.ndarray):
        block.flags.writeable = False
    return block


def in_memory_data(da: xr.DataArray) -> bool:
    """Whether ``da`` holds its data as a NumPy or CuPy array, not a file's lazy reader."""
    data = da.variable._data  # ``.data`` would read a lazily indexed file variable whole
    return isinstance(data, np.ndarray) or is_cupy(data)


def _apply_padded(
    backend: Any,
    *,
    function: Callable[..., np.ndarray],
    arguments: Mapping[str, Any],
    depth: Mapping[int, Halo],
    block_info: Mapping[Any, Any] | None = None,
) -> np.ndarray:
    """Read one block and its halo from ``backend``, apply ``function``, cut the halo off."""
    info = block_info[None]
    region, keep = [], []
    for axis, ((start, stop), size) in enumerate(
        zip(info["array-location"], info["shape"], strict=True)
    ):
        before, after = halo_sides(depth.get(axis, 0))
        lo = max(0, start - before)
        hi = min(size, stop + after)
        region.append(slice(lo, hi))
        keep.append(slice(start - lo, start - lo + stop - start))
    block = np.asarray(backend[tuple(region)])
    return function(block, **arguments)[tuple(keep)]


def map_blocks_with_halo(
    data: Any,
    func: Callable[..., np.ndarray],
    depth: Mapping[int, Halo],
    dtype: np.dtype | str,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to each block of ``data`` padded by ``depth`` neighbours per axis.

    A depth is elements per side, or ``(before, after)`` (a trailing window reads only the
    elements before its block).

    ``func(block, **kwargs)`` returns an array of its padded block's shape. Equal to
    ``data.map_overlap(func, depth=depth, boundary="none", ...)``; for data read straight from
    a file, each task reads its padded block from the file itself (no neighbour pieces move
    between tasks, none are held). NumPy (or CuPy) data is passed to ``func`` whole. The
    result's blocks are of ``data``'s array type (CuPy chunks give CuPy chunks).
    """
    import dask.array
    from dask.array.utils import meta_from_array
    from dask.base import tokenize

    dtype = np.dtype(dtype)
    if not _is_dask(data):
        return func(data if is_cupy(data) else np.asarray(data), **kwargs)
    # an axis in one chunk has no neighbour: no halo (a dim shorter than the halo stays whole)
    depth = {
        axis: widest_halo(k, 0)
        for axis, k in depth.items()
        if any(halo_sides(k)) and len(data.chunks[axis]) > 1
    }
    backend = file_backend(data)
    meta = meta_from_array(array_meta(data), ndim=data.ndim, dtype=dtype)
    token = tokenize(data.name, func, depth, kwargs)
    # the function and its arguments: one key each, not a copy in every task
    shared = once_in_graph({"function": func, "arguments": kwargs}, f"memchunk-call-{token}")
    if backend is not None:
        backend = with_direct_zarr_reads(backend)
        return dask.array.map_blocks(
            _apply_padded,
            backend,
            depth=depth,
            **shared,
            chunks=data.chunks,
            dtype=dtype,
            meta=meta,
            name=f"memchunk-halo-read-{token}",
        )
    named = {"dtype": dtype, "meta": meta, "name": f"{dask.utils.funcname(func)}-{token}"}
    if not depth:
        return data.map_blocks(call_with, **shared, **named)
    return data.map_overlap(call_with, depth=depth, boundary="none", **shared, **named)

"""Where a variable's data comes from, and how each task of ``apply`` gets its block.

Three kinds of input (:class:`~xarray_memchunk.planning.footprint.InputKind`):

- ``FILE``: a variable exactly as ``xarray.open_dataset(..., chunks=...)`` /
  ``xarray.open_zarr`` made it, a Dask array whose every chunk is read from xarray's lazily
  indexed backend array. ``apply`` reads the planned chunks (halo included) straight from the
  file instead of rechunking or overlapping inside the graph, so no worker holds chunks for
  other tasks.
- ``GRAPH``: any other Dask array; rechunks and halos happen inside the graph.
- ``MEMORY``: NumPy data, cut into the planned chunks by ``apply``.

A file read with a halo (:func:`map_blocks_with_halo`) gives the same values as
``dask.array.map_overlap(..., boundary="none")``: interior sides of a block get ``depth``
neighbouring elements, sides on the array's edge none.

Reads are bounded (:class:`BoundedReads`): a region is read in groups of storage chunks that
touch at most :data:`~xarray_memchunk.planning.footprint.READ_GROUP_BYTES` of storage, since
Zarr decodes up to 10 chunks at once, each beside its compressed bytes (measured: reading one
whole 64 MB chunk peaks at 185 MB, two at 290 MB).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..planning.footprint import READ_GROUP_BYTES, InputKind
from .arrays import is_cupy

__all__ = [
    "BoundedReads",
    "device_of",
    "file_backend",
    "input_kind",
    "map_blocks_with_halo",
    "read_chunked",
    "source_chunks",
    "storage_chunks",
]


def _is_dask(data: Any) -> bool:
    return hasattr(data, "dask") and hasattr(data, "chunks")


#: Name prefix of the Dask arrays :func:`read_chunked` makes.
READ_PREFIX = "memchunk-read-"


def file_backend(data: Any) -> Any | None:
    """The backend array a Dask array reads from, when it is nothing but reads from a file.

    That is the graph ``dask.array.from_array`` makes of xarray's lazily indexed array: two
    layers, ``original-...`` holding the array and the getter tasks (as ``xarray.open_dataset``
    makes it), or the one layer of :func:`read_chunked`'s getters with the array inlined.
    Returns None for any other array (computed, selected, rechunked, or NumPy data).
    """
    if not _is_dask(data):
        return None
    layers = getattr(data.__dask_graph__(), "layers", None)
    if layers is None or data.name not in layers:
        return None
    if len(layers) == 1 and str(data.name).startswith(READ_PREFIX):
        task = next(iter(dict(layers[data.name]).values()))
        args = [getattr(a, "value", a) for a in getattr(task, "args", ())]  # dask's DataNode
        return next((a for a in args if isinstance(a, BoundedReads)), None)
    originals = [name for name in layers if str(name).startswith("original-")]
    if len(layers) != 2 or len(originals) != 1:
        return None
    values = list(dict(layers[originals[0]]).values())
    if len(values) != 1:
        return None
    from xarray.backends.common import BackendArray

    backend = values[0]
    if isinstance(backend, np.ndarray):
        return None
    inner = backend
    while inner is not None and not isinstance(inner, BackendArray):
        inner = getattr(inner, "array", None)
    if inner is None or tuple(getattr(backend, "shape", ())) != tuple(data.shape):
        return None
    return backend


def device_of(da: xr.DataArray) -> str:
    """``"gpu"`` when ``da`` holds CuPy data (or dask chunks of CuPy), else ``"cpu"``."""
    data = da.data
    return "gpu" if is_cupy(getattr(data, "_meta", data)) else "cpu"


def input_kind(da: xr.DataArray) -> InputKind:
    """Classify ``da``'s data: read from a file, produced by a Dask graph, or in memory."""
    if not _is_dask(da.data):
        return InputKind.MEMORY
    return InputKind.FILE if file_backend(da.data) is not None else InputKind.GRAPH


def storage_chunks(da: xr.DataArray) -> dict[str, int | None]:
    """Storage chunk length per dim: on-disk chunks from the encoding, else the Dask chunks.

    None for a dim with neither (NumPy data).
    """
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
    """Storage chunk length per dim of a variable read from a file (its length where unknown)."""
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
        self.array = array
        self.storage = tuple(int(c) for c in storage)
        self.max_bytes = int(max_bytes)
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        region = tuple(slice(*k.indices(n)[:2]) for k, n in zip(key, self.shape, strict=True))
        return self._read(region)

    def _touched(self, region: tuple[slice, ...]) -> list[tuple[int, int]]:
        """First and last storage chunk index the region touches, per axis."""
        return [
            (s.start // c, max(s.start, s.stop - 1) // c)
            for s, c in zip(region, self.storage, strict=True)
        ]

    def _read(self, region: tuple[slice, ...]) -> np.ndarray:
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
            return np.asarray(self.array[region])
        first, last = touched[split]
        per_chunk = storage_bytes // (last - first + 1)
        group = max(1, self.max_bytes // max(1, per_chunk))
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=self.dtype)
        axis_region = region[split]
        c = self.storage[split]
        for k in range(first, last + 1, group):
            lo = max(axis_region.start, k * c)
            hi = min(axis_region.stop, (k + group) * c)
            sub = (*region[:split], slice(lo, hi), *region[split + 1 :])
            where = (slice(None),) * split + (
                slice(lo - axis_region.start, hi - axis_region.start),
            )
            out[where] = self._read(sub)
        return out


def read_chunked(da: xr.DataArray, chunks: Mapping[str, tuple[int, ...]]) -> xr.DataArray:
    """``da`` (read from a file) as a Dask array whose tasks read the given chunks from the file.

    Reads are bounded (:class:`BoundedReads`).
    """
    import dask.array
    from dask.base import tokenize

    backend = file_backend(da.data)
    if backend is None:
        raise ValueError("read_chunked needs a variable read straight from a file")
    if not isinstance(backend, BoundedReads):
        storage = file_chunks(da)
        backend = BoundedReads(backend, tuple(storage[str(d)] for d in da.dims))
    dask_chunks = tuple(tuple(chunks[str(d)]) for d in da.dims)
    name = f"{READ_PREFIX}{tokenize(da.data.name, dask_chunks)}"
    # inlined, each read is a root task of its own, which Dask fuses into the task that uses
    # the block; with a shared ``original-`` key it stays a task apart, and a worker may read
    # the next block before the current one is used (one more block held)
    data = dask.array.from_array(
        backend, chunks=dask_chunks, name=name, meta=np.ndarray, inline_array=True
    )
    return da.copy(data=data)


def _apply_padded(
    backend: Any,
    func: Callable[..., np.ndarray],
    depth: Mapping[int, int],
    kwargs: Mapping[str, Any],
    block_info: Mapping[Any, Any] | None = None,
) -> np.ndarray:
    """Read one block and its halo from ``backend``, apply ``func``, and cut the halo off."""
    info = block_info[None]
    region, keep = [], []
    for axis, ((start, stop), size) in enumerate(
        zip(info["array-location"], info["shape"], strict=True)
    ):
        lo = max(0, start - depth.get(axis, 0))
        hi = min(size, stop + depth.get(axis, 0))
        region.append(slice(lo, hi))
        keep.append(slice(start - lo, start - lo + stop - start))
    block = np.asarray(backend[tuple(region)])
    return func(block, **kwargs)[tuple(keep)]


def map_blocks_with_halo(
    data: Any,
    func: Callable[..., np.ndarray],
    depth: Mapping[int, int],
    dtype: np.dtype | str,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to each block of ``data`` padded by ``depth`` neighbours per axis.

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
    depth = {axis: int(k) for axis, k in depth.items() if k and len(data.chunks[axis]) > 1}
    backend = file_backend(data)
    meta = meta_from_array(data._meta, ndim=data.ndim, dtype=dtype)
    if backend is not None:
        return dask.array.map_blocks(
            _apply_padded,
            backend,
            func,
            depth,
            kwargs,
            chunks=data.chunks,
            dtype=dtype,
            meta=meta,
            name=f"memchunk-halo-read-{tokenize(data.name, func, depth, kwargs)}",
        )
    if not depth:
        return data.map_blocks(func, dtype=dtype, meta=meta, **kwargs)
    return data.map_overlap(func, depth=depth, boundary="none", dtype=dtype, meta=meta, **kwargs)

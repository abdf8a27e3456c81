"""Read a local Zarr array's storage chunks straight from their files, one at a time.

zarr-python 3 reads a region through its asynchronous codec pipeline: a coroutine, a thread
hand-off and several buffers per storage chunk. For the many small chunks of a time-chunked
store that costs more than decoding them. Measured on the climate cube of
``benchmarks/peers.py`` (2920 x 288 x 720 float32, one-day zstd chunks, local store), reading
and reducing all of it in tasks of 161 days on a ``LocalCluster`` of 2 workers x 1 thread:
7.4-9.1 s through zarr (13.8-16.2 CPU seconds in the workers, 6.0-7.5 of them in the
kernel), 3.7-4.4 s reading each chunk's file and decoding it with numcodecs straight into the
block (6.9-8.0 CPU seconds); zarr with the ``zarrs`` codec pipeline 5.8-6.5 s.

:class:`DirectChunkReads` does the second, for the layouts it can read exactly: a local store
(``zarr.storage.LocalStore``), no sharding, native byte order, C order, no filters, and one
compressor that numcodecs decodes, or none: zstd (without a checksum in zarr format 3), blosc
or gzip in zarr format 3; any of numcodecs' zstd, blosc, gzip, zlib, lz4 in zarr format 2.
Any other layout, a selection other than a range per axis, or a region with a storage chunk
that was never written (it reads as the fill value) is read by zarr itself, so values never
differ from zarr's. :func:`with_direct_zarr_reads` puts one under xarray's lazily indexed
wrappers of a variable (its decoding, e.g. scale and offset, stays as it is).
"""

from __future__ import annotations

import copy
import itertools
import math
import mmap
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SCRATCH_BYTES",
    "DirectChunkReads",
    "chunk_directory",
    "direct_reader",
    "scratch",
    "with_direct_zarr_reads",
]

#: Largest buffer a thread keeps for reuse (:func:`scratch`): a worker's thread holds up to
#: this for compressed chunks and :data:`~.zarr_writes.TILE_BYTES` for tiles, beside its tasks.
SCRATCH_BYTES = 4 * 2**20
_SCRATCH = threading.local()

#: numcodecs' names of the compressors read directly (zarr format 2 metadata holds these).
NUMCODECS_COMPRESSORS = ("zstd", "blosc", "gzip", "zlib", "lz4")
#: zarr format 3 compressor codecs read directly: codec name -> numcodecs codec id.
ZARR3_COMPRESSORS = {"zstd": "zstd", "blosc": "blosc", "gzip": "gzip"}


class DirectChunkReads:
    """A Zarr array whose basic slicing reads its storage chunks' files directly.

    Build with :meth:`of`, which returns None for a layout it cannot read exactly. Other
    indexing and any attribute are the Zarr array's own.

    Parameters
    ----------
    array
        The ``zarr.Array``.
    directory
        The directory its chunk keys are relative to.
    compressor
        numcodecs' configuration of its compressor, or None where chunks are stored raw.
    staged
        Whether the store is a staged one, written once and never changed while it is read:
        a region that is one raw chunk is then read by mapping its file (:meth:`mapped`). A
        missing chunk file is read through zarr, whose staged store raises for it
        (:class:`~xarray_memchunk.operators.staged_zarr.StagedStore`).
    """

    def __init__(
        self,
        array: Any,
        directory: Path,
        compressor: dict[str, Any] | None,
        staged: bool = False,
    ):
        self.array = array
        self.directory = Path(directory)
        self.compressor = compressor
        self.chunk_shape = tuple(int(c) for c in array.chunks)
        self.maps = staged and compressor is None and hasattr(mmap, "MAP_PRIVATE")
        self._codec: Any = None

    @classmethod
    def of(cls, array: Any) -> DirectChunkReads | None:
        """``array`` read directly, or None where its layout is not one this reads exactly."""
        directory = chunk_directory(array)
        compressor = _compressor(array.metadata) if directory is not None else False
        if compressor is False:
            return None
        return cls(array, directory, compressor, staged=_staged(array.store_path.store))

    def __getattr__(self, name: str) -> Any:
        if name in ("array", "__setstate__"):  # not yet set (unpickling): not the array's
            raise AttributeError(name)
        return getattr(self.array, name)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "_codec"} | {"_codec": None}

    def __getitem__(self, key: Any) -> Any:
        region = _ranges(key, self.array.shape)
        if region is None:
            return self.array[key]
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=self.array.dtype)
        if out.size and not self.read_into(region, out):
            return self.array[key]
        return out

    def mapped(self, region: tuple[slice, ...]) -> np.ndarray | None:
        """``region`` as the mapped file of its chunk, or None where it cannot be so read.

        Where :attr:`maps` and the region is one chunk (an edge chunk cut short along its
        first axis only), its file is mapped copy-on-write: the block is the file's pages,
        read as the task touches them, with no copy (writes to it stay in the task). None
        where the region is anything else or the chunk has no file of its size.
        """
        if not self.maps:
            return None
        index = []
        for axis, (s, c, n) in enumerate(
            zip(region, self.chunk_shape, self.array.shape, strict=True)
        ):
            stop = min(s.start + c, n) if axis == 0 else s.start + c
            if s.start % c or s.stop != stop:
                return None
            index.append(s.start // c)
        path = self.directory / self.array.metadata.encode_chunk_key(tuple(index))
        dtype = np.dtype(self.array.dtype)
        nbytes = dtype.itemsize * math.prod(self.chunk_shape)
        try:
            with path.open("rb") as f:
                if os.fstat(f.fileno()).st_size != nbytes or not nbytes:
                    return None
                mapping = mmap.mmap(
                    f.fileno(),
                    nbytes,
                    flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
        except FileNotFoundError:
            return None
        chunk = np.frombuffer(mapping, dtype=dtype).reshape(self.chunk_shape)
        return chunk[: region[0].stop - region[0].start]

    def read_into(self, region: tuple[slice, ...], out: np.ndarray) -> bool:
        """Fill ``out`` with ``region`` (a ``slice(start, stop)`` per axis).

        Returns False, with ``out`` partly filled, where a storage chunk in the region has no
        file: zarr reads it as the fill value, and the caller reads the region through zarr.
        """
        spans = [
            range(s.start // c, (s.stop - 1) // c + 1)
            for s, c in zip(region, self.chunk_shape, strict=True)
        ]
        buffer: np.ndarray | None = None
        for index in itertools.product(*spans):
            path = self.directory / self.array.metadata.encode_chunk_key(index)
            source, target, whole = [], [], True
            for i, s, c in zip(index, region, self.chunk_shape, strict=True):
                lo, hi = max(s.start, i * c), min(s.stop, (i + 1) * c)
                source.append(slice(lo - i * c, hi - i * c))
                target.append(slice(lo - s.start, hi - s.start))
                whole = whole and (hi - lo == c)
            into = out[tuple(target)]
            in_place = whole and into.flags.c_contiguous  # the chunk is all in the block
            if not in_place:
                if buffer is None:
                    buffer = np.empty(self.chunk_shape, dtype=self.array.dtype)
                into, part = buffer, into
            try:
                self._read_chunk(path, into)
            except FileNotFoundError:  # never written: zarr reads it as the fill value
                return False
            if not in_place:
                part[...] = buffer[tuple(source)]
        return True

    def _read_chunk(self, path: Path, into: np.ndarray) -> None:
        """Decode the chunk file ``path`` into ``into`` (C-contiguous, of the chunk's shape)."""
        if self.compressor is None:  # its bytes are the chunk's: read straight into the block
            raw = memoryview(into.reshape(-1).view(np.uint8))
            with path.open("rb", buffering=0) as f:
                size, done = os.fstat(f.fileno()).st_size, 0
                while size == raw.nbytes and done < size:  # one read gives at most ~2 GB
                    read = f.readinto(raw[done:])
                    if not read:  # the file was cut short since fstat
                        size = done
                    done += read
            if size != raw.nbytes:
                raise ValueError(
                    f"the Zarr chunk file {path} holds {size} bytes, where its chunk has "
                    f"{raw.nbytes}: the store is damaged"
                )
            return
        if self._codec is None:
            import numcodecs

            self._codec = numcodecs.get_codec(dict(self.compressor))
        with path.open("rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            encoded = scratch("encoded", size)
            raw, done = memoryview(encoded), 0
            while done < size:
                read = f.readinto(raw[done:])
                if not read:
                    break
                done += read
        self._codec.decode(encoded[:done], out=into)


def chunk_directory(array: Any) -> Path | None:
    """The directory of ``array``'s chunk files, where they can be read or written directly.

    That is a ``zarr.Array`` in a local store (``zarr.storage.LocalStore``, zarr 3), not
    sharded, of a native number dtype; None for anything else.
    """
    try:
        from zarr.storage import LocalStore
    except ImportError:  # zarr 2 has no such store: its own reads and writes stay
        return None
    store = getattr(getattr(array, "store_path", None), "store", None)
    if not isinstance(store, LocalStore) or getattr(array, "shards", None) is not None:
        return None
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biufc" or not dtype.isnative:
        return None
    return Path(store.root) / array.store_path.path


def scratch(name: str, nbytes: int) -> np.ndarray:
    """A buffer of ``nbytes`` (uint8) this thread reuses under ``name``, where it is small.

    Reads and writes of many storage chunks each need a buffer of about a chunk. A fresh one
    per chunk costs its pages each time in a Dask worker: the nanny sets
    ``MALLOC_TRIM_THRESHOLD_``, which keeps glibc's threshold for mapping an allocation at
    128 kB, so every larger one is mapped and faulted in anew (copying the 2920 one-day
    chunks of the 2.42 GB climate cube to ``/dev/shm`` on 2 workers took 4.67 task seconds
    so, 3.56 with buffers reused: ``benchmarks/staging_writes.py``). Buffers up to
    :data:`SCRATCH_BYTES` are kept, one per name per thread; a larger one is allocated each
    time.
    """
    if nbytes > SCRATCH_BYTES:
        return np.empty(nbytes, dtype=np.uint8)
    buffers = _SCRATCH.__dict__
    buffer = buffers.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[name] = np.empty(max(nbytes, 2**16), dtype=np.uint8)
    return buffer[:nbytes]


def _staged(store: Any) -> bool:
    """Whether ``store`` is a staged store (written once, never changed while it is read)."""
    try:
        from .staged_zarr import StagedStore
    except ImportError:  # pragma: no cover - zarr 2 has no staged store class
        return False
    return isinstance(store, StagedStore)


def _compressor(metadata: Any) -> dict[str, Any] | bool | None:
    """The numcodecs configuration of the one compressor, None for none, False if unsupported."""
    if metadata.zarr_format == 2:
        if metadata.filters or metadata.order != "C":
            return False
        if metadata.compressor is None:
            return None
        config = metadata.compressor.get_config()
        return config if config["id"] in NUMCODECS_COMPRESSORS else False
    codecs = [c.to_dict() for c in metadata.codecs]
    if not codecs or codecs[0]["name"] != "bytes":
        return False
    endian = (codecs[0].get("configuration") or {}).get("endian")
    if endian not in (None, "little") or not np.little_endian:
        return False
    if len(codecs) == 1:
        return None
    if len(codecs) > 2 or codecs[1]["name"] not in ZARR3_COMPRESSORS:
        return False
    config = dict(codecs[1].get("configuration") or {})
    if codecs[1]["name"] == "zstd" and config.get("checksum"):
        return False  # left to zarr, which checks the checksum its own way
    return {"id": ZARR3_COMPRESSORS[codecs[1]["name"]]}


def _ranges(key: Any, shape: tuple[int, ...]) -> tuple[slice, ...] | None:
    """``key`` as one ``slice(start, stop)`` per axis, or None for any other selection.

    As NumPy reads it: an ``Ellipsis`` or missing trailing axes are whole axes. A 0-d array has
    no ranges (None).
    """
    key = list(key) if isinstance(key, tuple) else [key]
    if key.count(Ellipsis) == 1:
        at = key.index(Ellipsis)
        key[at : at + 1] = [slice(None)] * (len(shape) - len(key) + 1)
    key += [slice(None)] * (len(shape) - len(key))
    if not shape or len(key) != len(shape) or not all(isinstance(k, slice) for k in key):
        return None
    region = []
    for k, n in zip(key, shape, strict=True):
        start, stop, step = k.indices(n)
        if step != 1:
            return None
        region.append(slice(start, max(start, stop)))
    return tuple(region)


def with_direct_zarr_reads(lazy: Any) -> Any:
    """A copy of xarray's lazily indexed ``lazy`` whose Zarr reads are direct, or ``lazy``.

    xarray's wrappers (indexing, copy-on-write, decoding) each hold the next as ``.array``;
    the innermost, ``xarray.backends.zarr.ZarrArrayWrapper``, holds the ``zarr.Array``. The
    wrappers down to it are copied (the variable's own are left as they are) and the copy's
    Zarr array is a :class:`DirectChunkReads`. Anything else, or a layout it does not read
    exactly, is returned unchanged.
    """
    try:
        from xarray.backends.zarr import ZarrArrayWrapper
    except ImportError:  # pragma: no cover - xarray without its zarr backend
        return lazy
    chain = []
    node = lazy
    while node is not None and not isinstance(node, ZarrArrayWrapper):
        chain.append(node)
        node = getattr(node, "array", None)
    if node is None or isinstance(node._array, DirectChunkReads):
        return lazy
    direct = DirectChunkReads.of(node._array)
    if direct is None:
        return lazy
    inner = copy.copy(node)
    inner._array = direct
    for wrapper in reversed(chain):
        outer = copy.copy(wrapper)
        outer.array = inner
        inner = outer
    return inner


def direct_reader(lazy: Any) -> DirectChunkReads | None:
    """The :class:`DirectChunkReads` under ``lazy``, where ``lazy[region]`` is its region as is.

    That is where every wrapper of xarray's between them passes a range through unchanged:
    the indexing adapters, copy-on-write, a lazy index that selects the whole array, and the
    Zarr wrapper of the same dtype. Where there is decoding (scale, offset, a mask) or a
    selection, None: the region is read through the wrappers.
    """
    try:
        from xarray.backends.zarr import ZarrArrayWrapper
        from xarray.core.indexing import (
            BasicIndexer,
            CopyOnWriteArray,
            ImplicitToExplicitIndexingAdapter,
            LazilyIndexedArray,
        )
    except ImportError:  # pragma: no cover - an xarray without these
        return None
    shape = tuple(getattr(lazy, "shape", ()))
    node = lazy
    while isinstance(node, ImplicitToExplicitIndexingAdapter | CopyOnWriteArray):
        node = node.array
    if isinstance(node, LazilyIndexedArray):
        key = node.key.tuple
        whole = isinstance(node.key, BasicIndexer) and len(key) == len(node.array.shape)
        whole = whole and all(
            isinstance(k, slice) and k.indices(n) == (0, n, 1)
            for k, n in zip(key, node.array.shape, strict=True)
        )
        if not whole:
            return None
        node = node.array
    if not isinstance(node, ZarrArrayWrapper) or not isinstance(node._array, DirectChunkReads):
        return None
    direct = node._array
    if tuple(direct.array.shape) != shape or np.dtype(node.dtype) != np.dtype(direct.array.dtype):
        return None
    return direct

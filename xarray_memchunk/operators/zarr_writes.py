"""Write an uncompressed local Zarr array's storage chunks straight to their files.

A staged store (:mod:`.staging`) is written once, uncompressed, and read back once. Through
zarr-python 3 each chunk's write is a coroutine, a thread hand-off and copies of its bytes:
copying the 2.42 GB climate cube of ``benchmarks/peers.py`` from its one-day zstd chunks into
a store in ``/dev/shm`` took 6.1 s in one thread through zarr, 3.4 s written straight
(``python benchmarks/staging_writes.py``).

:class:`DirectChunkWrites` writes a block to the chunk files for the layouts whose files are
the chunk's bytes as they are: a local store, no sharding, no compressor or filter, native
little-endian byte order, C order. A block may be any range along the first axis, in whole
chunks along the others: each chunk gets its slab, one range of its file's bytes, so several
tasks may write one chunk; any other region is refused, as zarr's read, change and write of
whole chunk files would lose what other tasks write. An edge chunk is stored at the chunk's
shape, as zarr stores it: the fill value past the array's end along the other axes, zeros
along the first (nothing reads either). :func:`copy_region` copies a
region from a :class:`~xarray_memchunk.operators.zarr_reads.DirectChunkReads` source a few
storage chunks at a time, with no block of the region held.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .zarr_reads import DirectChunkReads, _compressor, _ranges, chunk_directory, scratch

__all__ = [
    "COPY_GROUP_BYTES",
    "TILE_BYTES",
    "ChunkFiles",
    "DirectChunkWrites",
    "copies_directly",
    "copy_region",
]

#: Bytes copied at once from a slab that is not contiguous in its block before they are
#: written: a tile stays in the cache between its copy and its write.
TILE_BYTES = 2**20
#: Bytes of the source :func:`copy_region` decodes at once, in whole storage chunks (measured,
#: copying the 2.42 GB cube's 2920 one-day chunks of 0.83 MB: 3.41 s in groups of 4 MiB,
#: 3.70 s one chunk at a time and in groups of 16 MiB; ``benchmarks/staging_writes.py``).
COPY_GROUP_BYTES = 4 * 2**20


class DirectChunkWrites:
    """A Zarr array whose basic slice assignment writes whole storage chunks to their files.

    Build with :meth:`of`, which returns None for a layout it cannot write exactly.

    Parameters
    ----------
    array
        The ``zarr.Array`` (its metadata written).
    directory
        The directory its chunk keys are relative to.
    """

    def __init__(self, array: Any, directory: Path):
        self.array = array
        self.directory = Path(directory)
        self.shape = tuple(int(n) for n in array.shape)
        self.chunk_shape = tuple(int(c) for c in array.chunks)
        self.dtype = np.dtype(array.dtype)

    @classmethod
    def of(cls, array: Any) -> DirectChunkWrites | None:
        """``array`` written directly, or None where its layout is not one this writes exactly."""
        directory = chunk_directory(array)
        if directory is None or not np.little_endian or not hasattr(os, "pwrite"):
            return None  # no os.pwrite on Windows
        if _compressor(array.metadata) is not None:  # compressed, or not read exactly
            return None
        return cls(array, directory)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Write ``value`` (cast to the array's dtype, as zarr casts it) to the region ``key``.

        Raises
        ------
        ValueError
            Where ``key`` is not a :meth:`writable` region: zarr would read, change and write
            whole chunk files, and lose what other tasks write to them at the same time.
        """
        region = _ranges(key, self.shape)
        if region is None or not self.writable(region):
            raise ValueError(
                f"{key!r} is not slabs of whole chunks of {self.chunk_shape}: it cannot be "
                f"written beside other writers"
            )
        shape = tuple(s.stop - s.start for s in region)
        self.write(region, np.broadcast_to(np.asarray(value, dtype=self.dtype), shape))

    def writable(self, region: tuple[slice, ...]) -> bool:
        """Whether ``region`` is slabs of whole chunks.

        Any range along the first axis, and whole chunks along the others (an edge chunk ends
        at the array's end).
        """
        return all(
            s.start % c == 0 and (s.stop % c == 0 or s.stop == n)
            for s, c, n in zip(region[1:], self.chunk_shape[1:], self.shape[1:], strict=True)
        )

    def write(
        self, region: tuple[slice, ...], block: np.ndarray, files: ChunkFiles | None = None
    ) -> None:
        """Write ``block`` (of ``region``'s shape; :meth:`writable`) to its chunk files.

        Each chunk the region touches gets the region's slab of it: a range of its first axis,
        whole along the others, which is one range of the chunk file's bytes (C order). A chunk
        file is made at its chunk's size (zeros where nothing is written yet), so that several
        tasks may write slabs of one chunk, each its own bytes. ``files``: the chunk files
        open already (a task that writes several blocks opens each once); None, opened here.
        """
        if files is None:
            with ChunkFiles(self) as opened:
                self.write(region, block, opened)
            return
        first = self.chunk_shape[0]
        spans = [
            range(s.start // c, -(-s.stop // c))
            for s, c in zip(region, self.chunk_shape, strict=True)
        ]
        row_bytes = self.dtype.itemsize * math.prod(self.chunk_shape[1:])
        padded: np.ndarray | None = None
        for index in itertools.product(*spans):
            part = tuple(
                slice(max(i * c, s.start) - s.start, min((i + 1) * c, s.stop) - s.start)
                for i, s, c in zip(index, region, self.chunk_shape, strict=True)
            )
            slab = block[part]
            if slab.shape[1:] != self.chunk_shape[1:]:  # an edge chunk: at the chunk's shape
                shape = (slab.shape[0], *self.chunk_shape[1:])
                if padded is None or padded.shape != shape:
                    padded = np.empty(shape, dtype=self.dtype)
                padded[...] = self._fill_value()
                padded[tuple(slice(0, n) for n in slab.shape)] = slab
                slab = padded
            offset = (region[0].start + part[0].start - index[0] * first) * row_bytes
            _write_slab(files.fd(index), slab, offset)

    def chunk_bytes(self) -> int:
        """Bytes of one chunk file."""
        return self.dtype.itemsize * math.prod(self.chunk_shape)

    def _fill_value(self) -> Any:
        fill = getattr(self.array.metadata, "fill_value", None)
        return 0 if fill is None else fill


class ChunkFiles:
    """The chunk files a task writes to, each opened once; a context manager that closes them.

    A file is made, with its directories, at its chunk's size where it is shorter (never
    shortening what another task wrote).

    Parameters
    ----------
    writer
        The array whose chunk files they are.
    """

    def __init__(self, writer: DirectChunkWrites):
        self.writer = writer
        self.open: dict[tuple[int, ...], int] = {}

    def fd(self, index: tuple[int, ...]) -> int:
        """The file descriptor of chunk ``index``'s file, open for writing."""
        fd = self.open.get(index)
        if fd is None:
            writer = self.writer
            path = writer.directory / writer.array.metadata.encode_chunk_key(index)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            self.open[index] = fd
            if os.fstat(fd).st_size < writer.chunk_bytes():
                os.ftruncate(fd, writer.chunk_bytes())
        return fd

    def __enter__(self) -> ChunkFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()


def _write_slab(fd: int, slab: np.ndarray, offset: int) -> None:
    """Write the slab's bytes (C order) at ``offset`` of the file ``fd``.

    A slab that is not contiguous (a piece of its block) is copied in tiles of about
    :data:`TILE_BYTES` along its first axis, each written at once: no copy of the whole slab
    is held, and each tile is still in the cache when it is written.
    """
    if slab.flags.c_contiguous:
        _write_all(fd, slab, offset)
        return
    step = max(1, TILE_BYTES // max(slab[0].nbytes, 1))
    for start in range(0, slab.shape[0], step):
        part = slab[start : start + step]
        tile = scratch("tile", part.nbytes).view(slab.dtype).reshape(part.shape)
        np.copyto(tile, part)
        _write_all(fd, tile, offset)
        offset += tile.nbytes


def _write_all(fd: int, data: np.ndarray, offset: int) -> None:
    """Write the bytes of the C-contiguous ``data`` at ``offset`` of the file ``fd``."""
    raw = memoryview(data.reshape(-1).view(np.uint8))
    done = 0
    while done < raw.nbytes:  # one write gives at most ~2 GB
        done += os.pwrite(fd, raw[done:], offset + done)


def copy_region(
    reader: DirectChunkReads, writer: DirectChunkWrites, region: tuple[slice, ...]
) -> int:
    """Copy ``region`` of ``reader``'s array into ``writer``'s, a few source chunks at a time.

    The source's storage chunks in the region are decoded, :data:`COPY_GROUP_BYTES` or one
    chunk at a time along the first axis, into a buffer and written as slabs of the target's
    chunks (:meth:`DirectChunkWrites.write`): no block of the region is held, and what was
    decoded is still in the cache when it is written. A storage chunk with no file is read by
    zarr (its fill value).

    Parameters
    ----------
    reader
        The source, read directly.
    writer
        The target, of the source's shape and dtype (:func:`copies_directly`).
    region
        A ``slice(start, stop)`` per axis.

    Returns
    -------
    int
        Bytes copied.
    """
    chunks = reader.chunk_shape
    chunk_bytes = writer.dtype.itemsize * math.prod(chunks)
    group = max(1, COPY_GROUP_BYTES // max(chunk_bytes, 1)) * chunks[0]
    spans = [
        range(region[0].start // group * group, region[0].stop, group),
        *(range(s.start // c * c, s.stop, c) for s, c in zip(region[1:], chunks[1:], strict=True)),
    ]
    buffer: np.ndarray | None = None
    with ChunkFiles(writer) as files:
        for starts in itertools.product(*spans):
            piece = tuple(
                slice(max(start, s.start), min(start + n, s.stop))
                for start, s, n in zip(starts, region, (group, *chunks[1:]), strict=True)
            )
            shape = tuple(s.stop - s.start for s in piece)
            if buffer is None or buffer.shape != shape:
                buffer = np.empty(shape, dtype=writer.dtype)
            if not reader.read_into(piece, buffer):
                buffer[...] = reader.array[piece]
            if not writer.writable(piece):
                raise ValueError(f"{piece} is not slabs of whole chunks of {writer.chunk_shape}")
            writer.write(piece, buffer, files)
    return math.prod(s.stop - s.start for s in region) * writer.dtype.itemsize


def copies_directly(reader: DirectChunkReads, writer: DirectChunkWrites) -> bool:
    """Whether :func:`copy_region` can copy ``reader``'s array into ``writer``'s.

    Same shape and dtype, and every source chunk whole chunks of the target along all axes but
    the first (or reaching the array's end).
    """
    return (
        tuple(reader.array.shape) == writer.shape
        and np.dtype(reader.array.dtype) == writer.dtype
        and all(
            s % c == 0 or s >= n
            for s, c, n in zip(
                reader.chunk_shape[1:], writer.chunk_shape[1:], writer.shape[1:], strict=True
            )
        )
    )

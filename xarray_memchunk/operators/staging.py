"""Rechunk through disk: stage a graph's data in a temporary Zarr store when memory cannot.

A Dask graph whose chunks cut a dim the operator needs whole (climate data in one-step time
chunks, after any preprocessing) is rechunked inside the graph, and every task then waits for
all the source chunks it spans: a median over 1200 time steps of 100-step chunks holds all 12
of them at once. Where that cannot fit, the data is written once to a temporary Zarr store, and
the operator's tasks then read their planned blocks from it, as they read any file (bounded
reads, nothing held for other tasks). rechunker and Cubed stage intermediate data the same way.

The store's chunks are chosen for the plan (:func:`staging_chunks`), as rechunker chooses its
intermediate chunks: a planned block that cuts a source chunk is stored in pieces no larger
than the block, and source chunks thinner than the block are taken a few per write task, so
that a block's read decodes little beyond the block. Stored in the source's chunks (one time
step each), a block of 3650 steps x 90 x 28 of a (3650, 4, 180, 360) cube would decode the
whole 7 GB store, for each of the plan's 26 tasks. Where the thin dim is the first, the
store's chunk along it is the planned block's, and each write task writes its slab of every
chunk (:func:`slab_writes`): a block is one chunk file, which its task maps rather than reads
(:meth:`~xarray_memchunk.operators.zarr_reads.DirectChunkReads.mapped`). The chunk files are
written straight (:mod:`~xarray_memchunk.operators.zarr_writes`), a file's source chunks
decoded a few at a time into them.

The store lives in the staging directory: the dask config key ``memchunk.staging-dir``, else
dask's ``temporary-directory``, else memory (``/dev/shm``) where the data fit beside the limits
of a ``LocalCluster``'s workers (:func:`memory_directory`, checked again when the data are
written), else the system's temporary directory. Where workers run on
other machines (a cluster that is not a ``LocalCluster``), only a configured
``memchunk.staging-dir`` is used: the workers must share it. Staging is refused when the
directory lacks room for the data. The store is removed when the Python process exits, and
by a later plan's staging where that process was killed (:mod:`.staged_stores`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..clusters import active_client, workers_on_this_machine
from ..models.profiling import trim_allocator
from ..units import format_seconds, format_size, format_size_up
from .sources import file_backend, file_reads, read_chunked
from .staged_stores import STORE_PREFIX, claim, release, remove_orphans, staged_bytes

__all__ = [
    "CHUNK_FILE_BYTES",
    "MERGE_COPIES",
    "MEMORY_SHARE",
    "MIN_STORE_CHUNK_BYTES",
    "STAGING_DIR_KEY",
    "UNCOMPRESSED",
    "WRITE_COPIES",
    "StagingChunks",
    "StagingSite",
    "block_read_bytes",
    "disk_bandwidth",
    "memory_directory",
    "stage",
    "staging_chunks",
    "slab_writes",
    "staging_site",
]

#: The dask config key naming the directory staged data is written to.
STAGING_DIR_KEY = "memchunk.staging-dir"
#: Bytes a write task holds per byte of its write chunk: the chunk, its encoded copy and the
#: compressor's buffer (measured: 2.3 x a 64 MB float64 chunk written to Zarr with zstd).
WRITE_COPIES = 3.0
#: Bytes a write task that merges source chunks holds beyond :data:`WRITE_COPIES`, per byte of
#: its write chunk: the source chunks it merges (its arguments, held to its end) and the next
#: merge's, produced ahead on its worker (measured on a 2 x 1-thread LocalCluster, the worker's
#: peak above idle: 4.8 x a 256 MB write chunk merged from two 100-step chunks and cut into 8
#: Zarr chunks, 3.9 x and 4.4 x ones of 197 and 100 MB merged from one-step chunks; unmerged,
#: 3.0 x a 128 MB chunk cut into 8, 2.0 x one written whole).
MERGE_COPIES = 2.0


def _zarr_version() -> str:
    """Zarr's version, from its metadata: importing it (~0.2 s) waits for the first write."""
    try:
        return importlib.metadata.version("zarr")
    except importlib.metadata.PackageNotFoundError:  # importable, not installed (a checkout)
        import zarr

        return zarr.__version__


#: Whether zarr is version 3 or later (its local store, encodings and config).
ZARR_3 = int(_zarr_version().split(".")[0]) >= 3
#: The staged store's encoding: no compressor. Staged data is written once and read back once
#: from a disk that holds its bytes (checked), and compressing it costs more than writing it:
#: a quantile over time of a 1.21 GB one-day-chunked store, staged, took 10.5 s and 10.6 s
#: uncompressed against 13.1 s and 13.3 s with Zarr's default zstd (2 workers x 1 thread).
UNCOMPRESSED = {"compressors": None} if ZARR_3 else {"compressor": None}
#: Room kept free on the staging disk beyond the data (fraction of the data).
DISK_MARGIN = 0.1
#: Share of the memory that no worker's limit reserves that staged data may take in
#: ``/dev/shm`` (:func:`memory_directory`): the rest stays for this process and others.
MEMORY_SHARE = 0.5
#: Linux's memory-backed directory, where staged data may go (:func:`memory_directory`).
SHARED_MEMORY = Path("/dev/shm")
#: Bytes written to measure the staging disk's bandwidth.
PROBE_BYTES = 64 * 2**20
#: The random block written over and over to make :data:`PROBE_BYTES`: a compressing file
#: system cannot shrink its records (one that deduplicates blocks would store it once), and it
#: is made in 6 ms where 64 MiB of random bytes took 93 ms.
PROBE_BLOCK_BYTES = 4 * 2**20
#: Smallest store chunk worth cutting a source chunk into where the planned chunk has no near
#: divisor (measured: writing a Zarr chunk to a local disk costs about 0.65 ms beside its bytes,
#: as much as writing 0.7 MB; 2700 chunks of 49 kB took 1.9 s, 30 of 4.4 MB 0.28 s).
MIN_STORE_CHUNK_BYTES = 2**20
#: What one store chunk costs a read beside its bytes, in bytes (its file: 0.65 ms, as much as
#: 0.7 MB; measured as for :data:`MIN_STORE_CHUNK_BYTES`).
CHUNK_FILE_BYTES = 700_000


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
    in_memory
        Whether the directory is memory (``/dev/shm``), chosen by :func:`memory_directory`.
    """

    directory: Path
    free_bytes: int
    bytes_per_second: float
    refusal: str = ""
    in_memory: bool = False

    @property
    def where(self) -> str:
        """The directory, for a plan's note, said to be memory where it is."""
        if self.in_memory:
            return f"{self.directory}, memory beyond the workers' limits"
        return str(self.directory)

    def speed(self, nbytes: float) -> str:
        """The disk's measured speed and what ``nbytes`` take there, for a plan's note."""
        if not self.bytes_per_second:
            return "disk speed not measured"
        return (
            f"{'memory' if self.in_memory else 'disk'} measured at "
            f"{format_size(self.bytes_per_second)}/s: about "
            f"{format_seconds(self.seconds(nbytes))} written and read back"
        )

    def seconds(self, nbytes: float) -> float:
        """Estimated time to write and read back ``nbytes`` (0 where not measured)."""
        return 2 * nbytes / self.bytes_per_second if self.bytes_per_second else 0.0


def _directory(shared_only: bool, nbytes: int, client: Any) -> tuple[Path | None, str, bool]:
    """The staging directory, where it comes from, and whether it is memory.

    ``memchunk.staging-dir``, else dask's ``temporary-directory``, else memory where
    ``nbytes`` fit there (:func:`memory_directory`), else the system's temporary directory;
    where the workers run on other machines (``shared_only``), only the first.
    """
    import dask

    configured = dask.config.get(STAGING_DIR_KEY, None)
    if configured:
        return Path(configured).expanduser(), f"{STAGING_DIR_KEY}", False
    if shared_only:
        return (
            None,
            (
                f"the workers run on other machines, so staged data needs a directory they all "
                f"share: set the dask config key {STAGING_DIR_KEY!r}"
            ),
            False,
        )
    temporary = dask.config.get("temporary-directory", None)
    if temporary:
        return Path(temporary).expanduser(), "dask's temporary-directory", False
    if memory_directory(nbytes, client) is not None:
        return SHARED_MEMORY, "memory beyond the workers' limits", True
    return Path(tempfile.gettempdir()), "the system's temporary directory", False


@lru_cache(maxsize=8)
def disk_bandwidth(directory: str) -> float:
    """Write bandwidth of ``directory`` in bytes per second, measured once per process.

    Writes :data:`PROBE_BYTES` (one random block of :data:`PROBE_BLOCK_BYTES`, over and over)
    to a temporary file there with ``fsync``, then closes and removes it, twice, and keeps the
    faster. Just after 2.4 GB were written there (the kernel
    still writing them back), five single probes measured 110-557 MiB/s, and five of the
    faster of two 422-520 MiB/s in one round, 93-528 MiB/s in another (``/tmp`` of this
    project's machine): fewer outliers, not none. Whether a plan stages turns on this figure.
    The file has no name where the file system allows it (:func:`_unnamed_file`): a process
    killed while it writes leaves nothing behind.
    """
    block = np.random.default_rng(0).bytes(PROBE_BLOCK_BYTES)
    blocks = max(1, PROBE_BYTES // PROBE_BLOCK_BYTES)
    seconds = []
    for _ in range(2):
        fd, path = _unnamed_file(directory)
        try:
            start = time.perf_counter()
            with os.fdopen(fd, "wb") as f:
                for _ in range(blocks):
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
            seconds.append(time.perf_counter() - start)
        finally:
            if path is not None:
                path.unlink(missing_ok=True)
    return blocks * len(block) / max(min(seconds), 1e-6)


def _unnamed_file(directory: str) -> tuple[int, Path | None]:
    """A file open for writing in ``directory``, and its name: none where it has none.

    Linux's ``O_TMPFILE`` makes a file no one can see, freed when it is closed or its process
    is killed. Where the system or the file system has no such files (NFS, macOS), a named
    temporary file, which the caller removes.
    """
    with contextlib.suppress(AttributeError, OSError):
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600), None
    fd, path = tempfile.mkstemp(prefix=".memchunk-disk-probe-", dir=directory)
    return fd, Path(path)


def memory_directory(nbytes: int, client: Any) -> Path | None:
    """``/dev/shm``, where ``nbytes`` of staged data fit in memory no worker's limit reserves.

    Only for a ``LocalCluster`` whose workers all have memory limits, on a machine whose
    memory this process may use whole (no cgroup or rlimit below it: ``/dev/shm`` pages are
    charged to the processes that write them): ``nbytes`` (and :data:`DISK_MARGIN`), with the
    stores already staged there, must be at most :data:`MEMORY_SHARE` of the available memory
    (those stores counted back in) less the limits of all the workers the cluster may run (an
    adaptive cluster's maximum of them; none without a maximum), and fit the free space of
    ``/dev/shm``. A worker's memory never holds the files: its tasks read their blocks from
    them, as from a disk. Through zarr's writes, staging the 2.42 GB cube of
    ``benchmarks/floors.py`` there took 3.5-4.2 s against 4.3-5.8 s in ``/tmp`` (ext4) on 2
    workers x 1 thread; written straight (:mod:`.zarr_writes`), 1.8-2.0 s in both, and the
    tasks that read it back took 2.1-2.2 s summed against 1.8-1.9 s from ``/tmp``
    (``benchmarks/staged_phases.py``, 3 runs each): this machine's page cache holds the data
    as well, where a disk's writes do not wait for it.

    Returns
    -------
    Path or None
        None where the data do not fit so, or the system has no ``/dev/shm``.
    """
    import psutil
    from distributed import LocalCluster
    from distributed.system import MEMORY_LIMIT

    from .._dask_compat import adaptive_bounds

    shm = SHARED_MEMORY
    cluster = getattr(client, "cluster", None)
    if not isinstance(cluster, LocalCluster) or not shm.is_dir() or not os.access(shm, os.W_OK):
        return None
    memory = psutil.virtual_memory()
    if MEMORY_LIMIT < memory.total:  # a cgroup or rlimit: the host's free memory is not ours
        return None
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    limits = [w.get("memory_limit") for w in workers]
    bounds = adaptive_bounds(cluster)
    if not limits or not all(limits) or (bounds is not None and not math.isfinite(bounds[1])):
        return None
    count = max(len(limits), int(bounds[1]) if bounds is not None else 0)
    reserved = count * max(int(n) for n in limits)
    staged = staged_bytes(shm)  # stores of this and other processes, in ``available`` no more
    room = MEMORY_SHARE * (memory.available + staged - reserved)
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        return None
    needed = nbytes * (1 + DISK_MARGIN)
    return shm if needed + staged <= room and needed <= free else None


def staging_site(nbytes: int, client: Any = None, measure_bandwidth: bool = True) -> StagingSite:
    """Where ``nbytes`` of staged data would be written, and whether they fit there.

    Unless ``memchunk.staging-dir`` or dask's ``temporary-directory`` names a directory:
    memory (:func:`memory_directory`) where the data fit there, else the system's temporary
    directory. The stores that killed processes of this host left there (and in memory) are
    removed first (:func:`~xarray_memchunk.operators.staged_stores.remove_orphans`): their
    space is free. ``measure_bandwidth=False`` writes nothing to measure the disk
    (``plan(measure="never")``): the site's bandwidth is then 0, not measured.
    """
    if SHARED_MEMORY.is_dir():  # killed processes' stores there hold memory
        with contextlib.suppress(OSError):
            remove_orphans(SHARED_MEMORY)
    shared_only = not workers_on_this_machine(client)
    directory, source, in_memory = _directory(shared_only, nbytes, client)
    if directory is None:
        return StagingSite(Path(), 0, 0.0, source)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_orphans(directory)
        free = shutil.disk_usage(directory).free
        bandwidth = disk_bandwidth(str(directory)) if measure_bandwidth else 0.0
    except OSError as exc:
        return StagingSite(directory, 0, 0.0, f"{directory} ({source}) cannot be written: {exc}")
    needed = nbytes * (1 + DISK_MARGIN)
    if free < needed:
        return StagingSite(
            directory,
            free,
            bandwidth,
            f"{directory} ({source}) has {format_size(free)} free, and staging needs "
            f"{format_size_up(needed)}: free space there or set {STAGING_DIR_KEY!r}",
        )
    return StagingSite(directory, free, bandwidth, in_memory=in_memory)


@dataclass(frozen=True)
class StagingChunks:
    """How one variable is staged: the chunks of its store, and of the graph written to it.

    Attributes
    ----------
    store
        Zarr chunk length per dim.
    write
        Chunk length per dim of the graph as it is written, one write task each: whole store
        chunks (the source's chunks, or several of them merged in memory).
    source
        Longest source chunk per dim.
    """

    store: dict[str, int]
    write: dict[str, int]
    source: dict[str, int]

    @property
    def merged(self) -> bool:
        """Whether a write task merges source chunks in memory."""
        return any(self.write[d] > self.source[d] for d in self.write)

    def write_bytes(self, itemsize: int) -> int:
        """Bytes of one write chunk."""
        return itemsize * math.prod(self.write.values())

    def task_bytes(self, itemsize: int) -> float:
        """Bytes a write task holds (what producing its source chunks holds aside)."""
        copies = WRITE_COPIES + (MERGE_COPIES if self.merged else 0.0)
        return copies * self.write_bytes(itemsize)

    def describe(self) -> str:
        """The store's chunks, the source chunks per write task, and the slabs it writes."""
        text = "chunks " + ", ".join(f"{d}: {n}" for d, n in self.store.items())
        merged = [
            f"{self.write[d] // self.source[d]} {d} chunks"
            for d in self.write
            if self.write[d] > self.source[d]
        ]
        if merged:
            text += f", {' x '.join(merged)} per write task"
        slabs = [f"{self.write[d]} {d}" for d in self.write if self.store[d] > self.write[d]]
        if slabs:
            text += f", each written in slabs of {' x '.join(slabs)}"
        return text


def block_read_bytes(store: int, planned: int, per_element: float) -> float:
    """What reading one planned block costs along a dim stored in chunks of ``store``, in bytes.

    A block of ``planned`` elements starts at a multiple of ``planned``, and so at one of the
    ``store / g`` offsets ``0, g, 2g...`` within a store chunk (``g`` their greatest common
    divisor): on average it spans ``(planned + store - g) / store`` store chunks, each a file
    (:data:`CHUNK_FILE_BYTES`) decoded whole (``per_element`` bytes per element along the dim).
    Writing them cost a file per store chunk too: ``planned / store`` per block.

    Parameters
    ----------
    store
        The store chunk's length along the dim.
    planned
        The planned block's length along it.
    per_element
        Bytes of a store chunk per element along the dim.

    Returns
    -------
    float
    """
    spanned = (planned + store - math.gcd(planned, store)) / store
    written = planned / store
    return spanned * (CHUNK_FILE_BYTES + store * per_element) + written * CHUNK_FILE_BYTES


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted({*small, *(n // k for k in small)})


def staging_chunks(
    source: Mapping[str, int],
    planned: Mapping[str, int],
    itemsize: int,
    write_bytes: float,
    reads_fit: Callable[[Mapping[str, int]], bool] | None = None,
    sizes: Mapping[str, int] | None = None,
    slabs: bool = False,
) -> StagingChunks:
    """Store and write chunks for data that comes in ``source`` chunks and is read in ``planned``.

    Per dim, ``s`` the source chunk (its longest) and ``p`` the planned one (its longest):

    - ``s > p`` (the plan cuts the source chunk): the store chunk is the largest divisor of
      ``s`` no longer than ``p``, and the source chunk is written as it is, in whole Zarr
      chunks (no two tasks write one). Where one source chunk spans the whole dim (``sizes``),
      any store chunk is whole in it, and the store chunk is ``p`` itself. A block then decodes
      at most one store chunk more than itself on each side. Where that divisor is shorter
      than ``p / 2`` (``s`` prime, say) and makes store chunks under
      :data:`MIN_STORE_CHUNK_BYTES`, a longer divisor (up to ``s`` itself) is taken where a
      block's read costs less from it (:func:`block_read_bytes`: tiny chunks cost a file each,
      :data:`CHUNK_FILE_BYTES`; longer ones decode more than the block), and cutting the graph
      in memory to ``p`` instead would make each write task gather two source chunks. The plan
      is made again for the store's chunks, so that extra decoding is in its prediction.
    - ``s < p`` (a block spans several source chunks: the dim the operator needs whole):
      ``m`` source chunks are merged in memory per write task (a task rechunk), ``m`` as large
      as keeps ``WRITE_COPIES + MERGE_COPIES`` x the write chunk within ``write_bytes`` (a
      merge holds the chunks it merges), and ``m x s`` at most ``p``. Where several dims are
      so, the thinnest against its planned chunk is merged first. The store chunk is the write
      chunk; where ``reads_fit`` says that reading the planned blocks from such chunks would
      not fit (a read decodes up to ten chunks at once), it is the longest ``k x s`` that
      does, and the write chunk as many whole store chunks as fit in ``m x s`` (at least half
      of it).
    - ``s == p``: as it is.

    Parameters
    ----------
    source
        Longest source chunk per dim.
    planned
        Longest planned chunk per dim.
    itemsize
        Bytes per element.
    write_bytes
        Bytes one write task may hold: the per-task budget less what producing a source chunk
        holds.
    reads_fit
        Whether the planned blocks, read from a store of the given chunks, fit the budget;
        None: any store chunk does.
    sizes
        Each dim's length, where known: a dim that one source chunk spans may be stored in
        chunks of any length. None: only divisors of the source chunk are taken.
    slabs
        Whether the store's chunks may be written in slabs along the first dim, several
        write tasks to a chunk (:func:`slab_writes`). Where the first dim is the only one
        merged, its store chunk is then the planned chunk (a block reads one store chunk along
        it), and each write task writes its slab of each.

    Returns
    -------
    StagingChunks
    """
    dims = list(source)
    source = {d: int(source[d]) for d in dims}
    planned = {d: int(planned.get(d, source[d])) for d in dims}
    store, write = dict(source), dict(source)

    def nbytes(chunk: Mapping[str, int]) -> int:
        return itemsize * math.prod(chunk.values())

    merged = sorted(
        (d for d in dims if source[d] < planned[d]), key=lambda d: source[d] / planned[d]
    )
    by_write = int(write_bytes // ((WRITE_COPIES + MERGE_COPIES) * nbytes(write)))
    longest = dict(source)  # the write chunk, before any merge is cut for reads
    for d in merged:
        m = max(1, min(planned[d] // source[d], by_write))
        longest[d] = m * source[d]
        by_write //= m
    for d in dims:
        if source[d] > planned[d]:
            whole = sizes is not None and d in sizes and source[d] >= sizes[d]
            lengths = _divisors(source[d]) + ([planned[d]] if whole else [])
            store[d] = max(k for k in lengths if k <= planned[d])
            chunk = nbytes(store | {m: longest[m] for m in merged})  # merged dims at length
            if 2 * store[d] < planned[d] and chunk < MIN_STORE_CHUNK_BYTES:
                per_element = chunk / store[d]  # bytes per step along d
                store[d] = min(
                    (k for k in lengths if k >= store[d]),
                    key=lambda k: block_read_bytes(k, planned[d], per_element),
                )
    store |= {d: longest[d] for d in merged}
    write |= {d: longest[d] for d in merged}
    first = dims[0] if dims else None
    if slabs and merged == [first] and planned[first] > store[first]:
        slab = store | {first: planned[first]}
        if reads_fit is None or reads_fit(slab):  # each block one store chunk along it
            return StagingChunks(slab, write, source)
    for d in reversed(merged):
        if reads_fit is None or reads_fit(store):
            break
        m = longest[d] // source[d]
        low, high = 1, m  # the longest k x s whose reads fit, reads growing with the chunk
        while low < high:
            k = (low + high + 1) // 2
            if reads_fit(store | {d: k * source[d]}):
                low = k
            else:
                high = k - 1
        # as many source chunks per write as fit, in whole store chunks of k to k / 2
        k = max(range(-(-low // 2), low + 1), key=lambda k: (k * (m // k), k))
        store[d], write[d] = k * source[d], k * (m // k) * source[d]
    return StagingChunks(store, write, source)


def slab_writes(dtype: np.dtype) -> bool:
    """Whether staged data of ``dtype`` is written chunk file by chunk file, in slabs.

    With zarr 3, for the dtypes a staged store holds as they are (native booleans and
    numbers: :class:`~xarray_memchunk.operators.zarr_writes.DirectChunkWrites`), where the
    system has ``os.pwrite`` (not Windows); xarray encodes dates to integers, and zarr writes
    those whole chunks at a time.
    """
    dtype = np.dtype(dtype)
    return (
        ZARR_3
        and dtype.kind in "biufc"
        and dtype.isnative
        and np.little_endian
        and hasattr(os, "pwrite")
    )


def _read_store(path: Path) -> Any:
    """What a staged result reads ``path`` through: a store that fails once it is removed.

    :class:`~xarray_memchunk.operators.staged_zarr.StagedStore`; the path itself on zarr 2.
    """
    try:
        from .staged_zarr import StagedStore
    except ImportError:  # zarr 2
        return path
    return StagedStore(path, read_only=True)


def _write(staged: xr.Dataset, name: str, path: Path, source: Any = None) -> None:
    """Write ``staged`` to a new Zarr store at ``path``; its ``name`` variable chunk file by file.

    xarray writes the metadata and the coordinates. Where the store's layout holds the chunks
    as they are (:class:`~xarray_memchunk.operators.zarr_writes.DirectChunkWrites`), each write
    task copies its region from ``source`` (a file's
    :class:`~xarray_memchunk.operators.zarr_reads.DirectChunkReads`, read chunk by chunk:
    :func:`~xarray_memchunk.operators.zarr_writes.copy_region`), or writes its Dask chunk; else
    (zarr 2, a variable encoded to another dtype) xarray writes them.
    """
    import dask
    import dask.array
    from dask.array.core import slices_from_chunks

    data = staged[name].data
    store = staged[name].encoding["chunks"]
    slabs = any(
        any(c % n for c in chunks[:-1]) for chunks, n in zip(data.chunks, store, strict=True)
    )  # write chunks that are not whole store chunks: slabs, several tasks to a chunk
    # the metadata and coordinates now; every chunk file is written, so a missing one is one
    # removed (StagedStore raises), not a chunk of fill values
    pending = staged.to_zarr(
        path,
        mode="w-",
        consolidated=False,
        compute=False,
        safe_chunks=not slabs,
        write_empty_chunks=True,
    )
    writer = None
    if ZARR_3:
        import zarr

        from .zarr_writes import DirectChunkWrites, copies_directly, copy_region

        array = zarr.open_group(path, mode="r+")[name]
        if np.dtype(array.dtype) == staged[name].dtype:
            writer = DirectChunkWrites.of(array)
    if writer is None and slabs:
        raise RuntimeError(f"zarr cannot write {store} chunks in slabs of {data.chunksize}")
    if writer is None:
        pending.compute()
    elif source is not None and copies_directly(source, writer):
        token = uuid.uuid4().hex[:12]
        tasks = [
            dask.delayed(copy_region, pure=False)(
                source, writer, region, dask_key_name=f"store-copy-{token}-{i}"
            )
            for i, region in enumerate(slices_from_chunks(data.chunks))
        ]
        dask.compute(*tasks)
    else:
        dask.array.store(data, writer, lock=False)


def stage(da: xr.DataArray, site: StagingSite, chunks: StagingChunks | None = None) -> xr.DataArray:
    """Write ``da`` to a new Zarr store in ``site`` now; ``da`` read from it.

    ``chunks``: the store's chunks and the write tasks' (:func:`staging_chunks`, for the plan);
    where None, the store's chunks are ``da``'s longest per dim (Zarr wants equal chunks;
    monthly chunks of 28 to 31 days become 31). A variable read straight from a file is read
    in write chunks (:func:`~xarray_memchunk.operators.sources.read_chunked`): each write task
    reads its own chunk, with no task per source chunk and nothing merged (staging the 2920
    one-day chunks of ``benchmarks/peers.py``'s cube took 10.2 s so, 30.6 s through a task per
    day, on 2 workers x 1 thread). A graph's source chunks are merged into write chunks by a
    task rechunk (``array.rechunk.method: tasks``), which Dask fuses with the write: a write
    task holds the chunks it merges beside the merged one (:data:`MERGE_COPIES`). The write
    runs on the active scheduler (a distributed client's workers, or threads: this process then
    hands the memory the writes freed back to the system, which glibc keeps otherwise: a
    staged median over ``open_mfdataset`` files with no cluster left 38 MiB, and its tasks then
    peaked at 0.86 of ``memory_limit``, 0.80 with it handed back). The store is
    removed when this process exits or :func:`~xarray_memchunk.operators.staged_stores.
    remove_staged_stores` is called, and at once if the write fails; an owner file beside it
    (:func:`~xarray_memchunk.operators.staged_stores.claim`) lets a later plan remove it where
    this process is killed.

    Raises
    ------
    MemchunkError
        When the write fails (the partial store is removed first).
    """
    import dask.array

    from ..errors import MemchunkError

    directory = site.directory
    if site.in_memory and memory_directory(da.nbytes, active_client()) is None:
        # memory filled since the plan: the disk instead (no temporary-directory was set)
        directory = Path(tempfile.gettempdir())
    path = directory / f"{STORE_PREFIX}{uuid.uuid4().hex[:12]}.zarr"
    name = da.name if da.name is not None else "staged"
    # without attrs: CF ones (scale_factor, units of times...) would be decoded on the way
    # back, where the values are written as they are; the result keeps da's own
    variable = da.rename(name).reset_coords(drop=True).variable.copy(deep=False)
    variable.attrs = {}
    if chunks is None:
        write = {d: max(c) for d, c in zip(da.dims, da.chunks, strict=True)}
        store = write
    else:
        write = {d: chunks.write[str(d)] for d in da.dims}
        store = {d: chunks.store[str(d)] for d in da.dims}
    source = None
    if file_backend(da.data) is not None:  # each write task reads its chunk from the file
        lengths = dask.array.core.normalize_chunks(tuple(write[d] for d in da.dims), da.shape)
        blocks = {str(d): c for d, c in zip(da.dims, lengths, strict=True)}
        reads = file_reads(da)
        variable = variable.copy(data=read_chunked(da, blocks, reads).data)
        # the Zarr variable's direct reads, where it has them (not several files' reads)
        source = getattr(reads, "direct", None)
        staged = xr.Dataset({str(name): variable})
    else:
        chunk_bytes = da.dtype.itemsize * math.prod(write.values())
        limits = {"array.rechunk.method": "tasks", "array.chunk-size": f"{max(chunk_bytes, 1)}B"}
        with dask.config.set(limits):
            staged = xr.Dataset({str(name): variable.chunk(write)})
    for var in staged.variables.values():
        var.encoding.clear()
    # safe_chunks (xarray's default) refuses a write chunk that is not whole Zarr chunks
    staged.variables[str(name)].encoding["chunks"] = tuple(store[d] for d in da.dims)
    staged.variables[str(name)].encoding |= UNCOMPRESSED
    try:
        claim(path)  # before the store: a process killed while writing it leaves an owner
        _write(staged, str(name), path, source)
        if active_client() is None:  # written by this process's threads, which run the tasks
            trim_allocator()
    except Exception as exc:
        release(path)
        raise MemchunkError(
            f"staging the data in {path.parent} failed ({type(exc).__name__}: {exc}); nothing "
            f"is left there. Set {STAGING_DIR_KEY!r} to another directory, or give the "
            f"workers more memory"
        ) from exc
    read = xr.open_zarr(_read_store(path), consolidated=False, chunks={})[str(name)]
    result = da.copy(data=read.data)
    result.encoding = dict(read.encoding)
    return result

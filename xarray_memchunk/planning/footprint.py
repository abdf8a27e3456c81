"""What a task slot must have room for: the task, its assembled input, and the chunks held for it.

A worker runs one task per thread, but holds more than those tasks. Measured on a
``LocalCluster`` (2 workers x 1 thread, no memory limit, peak RSS above the idle worker), for the
graphs ``apply`` builds:

==========================================  ================================================
input and plan                              held beside the running task
==========================================  ================================================
source chunks = planned chunks, no halo     nothing: reading or producing a chunk fuses
                                            into the task that uses it
source chunks split by the plan             3 source chunks (1 thread), 2.5 (2 threads)
small source chunks merged                  about 2 planned chunks
stencil (``map_overlap``), 3^3 to 10^3      35-58% of the whole array on one worker: neighbour
chunks                                      chunks wait for the tasks that take their halos
==========================================  ================================================

Hence three kinds of input (:class:`InputKind`): data read straight from a file (``FILE``),
which ``apply`` re-reads at the planned chunks, halo included, so nothing is held, and whose
reads touch at most ``READ_GROUP_BYTES`` of storage chunks (or one chunk, or
``READ_CONCURRENCY`` small ones) at once and hold ``READ_COPIES`` x that beside the block being
filled, before the task's own work starts (a variable stored without chunks, contiguous
netCDF, or in netCDF4 chunks with no filter, is read in groups of at most ``READ_GROUP_BYTES``
of its own range; where reads take a lock a worker's threads share, netCDF4 under xarray's, one
decodes at a time, and its copies are shared among the slots); data produced by a Dask graph,
which is rechunked and overlapped inside the graph (``GRAPH``); a NumPy array, which ``apply``
cuts into the planned chunks (``MEMORY``: a graph whose chunks are
the plan's). Per task slot:

- ``gather``: a task whose input is concatenated from pieces (a halo, or source chunks
  merged) holds the pieces and the concatenated block: one more padded input.
- ``held``: ``(threads + HELD_AHEAD) x`` the source chunks one task reads when the plan differs
  from the source chunks (``ALL_TO_ALL_COPIES x`` the whole array where every task reads every
  source chunk: each waits for the last task, and Dask's rechunk goes through an intermediate
  stage of the whole array), plus ``STENCIL_SHARE`` of a worker's share of the array for a stencil
  split across chunks, plus the operator's own ``held_share`` of it (intermediate results
  that wait for a later step, whatever the input); at most the whole array (twice it where
  every task reads every source chunk); and beside that, the halo slices cut from the
  stencil's chunks (``padded / chunk - 1`` x them: cutting a halo is a cheap task that runs as
  soon as its chunk is ready, and its slice waits for the task it pads). Per worker, divided
  among its threads.
- ``graph``: Dask's own record of each graph task a worker is given (its state, key and
  run spec), ``GRAPH_TASK_BYTES`` each, for the tasks it holds: where a graph's source chunks
  are ready, every task that slices them is ready too and is sent at once, so a worker holds
  them all (a one-chunk volume of 200^3 planned in 10^3 chunks with a halo of 9: 235,113 graph
  tasks, 1.9 GiB above the idle worker, where its data was 0.7 GiB). Per worker, divided among
  its threads.
- ``runtime``: the operator's ``runtime_bytes`` (compiled code a worker loads with its first
  task and keeps), per worker, divided among its threads.
- ``produce``: producing a graph's input (measured on one block of the real graph:
  :mod:`~xarray_memchunk.operators.production`). A slot makes a source chunk, then runs the
  operator; its peak is the larger phase. Making the chunk holds it and what producing it needs
  (an ``astype`` of a float64 generator holds the float64 block). Where the planned chunk is
  the source chunk, the operator's first step fuses into the same task, which keeps the
  graph's inputs to the fused steps until it ends (measured: std's tasks peaked 115 MB, the
  float64 block, above the larger phase), unless the operator says its first step is a task of
  its own (``Cost.fuses_with_input``). The term is what the larger phase adds to the task,
  shared among a worker's slots where the graph has fewer source chunks than the worker has
  threads (one block of 128 MiB made from float64 held 768 MiB above the idle worker: with
  4 threads and one source chunk, one slot makes it, not four); where its largest source
  chunks differ in size (a remainder), the slots making them at once count each at its own
  (``making_shares``: of a 4599-day float64 graph in 3797 and 802 days, on 2 threads, the
  second at about a fifth of the first). A Dataset's variables made by graphs of their own
  are made side by side: a worker's slots count the largest makings of all of them, each
  once.
- ``factors``: the operator's ``factors_bytes_per_chunk`` times the planned chunks (factors
  whose size does not depend on the chunk's), all chunks' on one worker: a tree reduction's
  factors gather on the worker where it ends (measured: a worker held most of the two-pass
  tsqr's tree). Kept apart from ``held``, which is the input's, so that advice about the input looks
  at the input's part alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = [
    "ALL_TO_ALL_COPIES",
    "HELD_AHEAD",
    "READ_CONCURRENCY",
    "READ_COPIES",
    "READ_GROUP_BYTES",
    "STENCIL_SHARE",
    "GRAPH_TASK_BYTES",
    "DimCut",
    "Footprint",
    "InputKind",
    "InputLayout",
    "footprint",
    "graph_tasks",
    "production_phases",
    "source_blocks",
]

#: Source chunks a worker holds beyond one per thread when the plan cuts them (measured: 3
#: source chunks with 1 thread, 2.5 with 2).
HELD_AHEAD = 2
#: Copies of the whole array a worker holds where every planned chunk reads every source chunk
#: of a graph (one-step time slabs rechunked to time whole, cut along the other dims): the
#: source chunks wait for the last task, and Dask's task rechunk merges them through an
#: intermediate stage first (measured: 1.27-1.75 x the array above the idle worker, 3542 x 73
#: x 146 float64 in one-step slabs to 3542 x 19 x 17 on 1 worker x 4 threads).
ALL_TO_ALL_COPIES = 2.0
#: Share of a worker's part of the array a stencil's neighbour chunks may hold (measured up to
#: 1.16 x the array / 2 workers).
STENCIL_SHARE = 1.25
#: Bytes a worker holds for each graph task it has been given, beside the task's data: Dask's
#: task state, key and run spec (measured on a LocalCluster of 1 worker x 2 threads, above the
#: data the tasks held: 5.1 KiB per task of a 200^3 stencil in 10^3 chunks, 235,113 tasks;
#: 6.4 KiB in 20^3 chunks, 26,953 tasks; 3.6-4.9 KiB for an element-wise function in 10^3
#: chunks, 24,001 tasks).
GRAPH_TASK_BYTES = 6 * 2**10
#: Storage bytes one read from a file may touch at once (larger regions are read in groups).
READ_GROUP_BYTES = 32 * 2**20
#: Storage chunks Zarr decodes at once (its ``async.concurrency``), which bounds a read of
#: small chunks.
READ_CONCURRENCY = 10
#: Bytes a read holds per storage byte it touches at once, beside the block it fills: the
#: compressed chunk, the decoded chunk, and the part copied into the block (measured 2.9 x a
#: 64 MB Zarr chunk read whole).
READ_COPIES = 3.0


class InputKind(StrEnum):
    """Where a variable's data comes from, which decides what a worker holds besides its tasks."""

    FILE = "file"
    GRAPH = "graph"
    MEMORY = "memory"


@dataclass(frozen=True)
class InputLayout:
    """One planned variable as it comes in.

    Attributes
    ----------
    name
        Variable name, for messages.
    dims
        Its dims.
    itemsize
        Bytes per element.
    kind
        Where the data comes from.
    source_chunks
        Longest chunk per dim as the data comes (the dim's length where it is one chunk).
    held_share
        Share of the whole array a worker holds beside its task because of the operator's
        graph (intermediate results waiting for a later step), whatever the input.
    factors_bytes_per_chunk
        Bytes the operator's graph holds for each planned chunk until a later step, whatever
        the chunk's size (the two-pass tsqr's ``n x n`` factors per row block), all on one
        worker: a tree's factors gather where it ends.
    reads_own_range
        A file variable whose reads touch their own range only, whatever ``source_chunks``
        say (stored without chunks, contiguous netCDF, or in netCDF4 chunks with no HDF5
        filter): a read holds up to ``READ_GROUP_BYTES`` of that range.
    produce_bytes
        What producing one source chunk of a graph holds beyond the chunk, at its peak
        (measured: :mod:`~xarray_memchunk.operators.production`).
    produce_held_bytes
        What stays held beside the chunk while an operator fused onto its production runs
        (measured likewise; 0 where the operator's first step does not fuse with it).
    runtime_bytes
        What a worker keeps once it has run the operator's first task (compiled code), once
        per worker: each of its task slots holds its share beside the task.
    serialized_reads
        A file variable whose reads take a lock shared by a worker's threads (netCDF4 under
        xarray's lock): one read decodes at a time, so its copies are shared among the slots.
    raw_reads
        A file variable stored uncompressed and read straight into the block (a staged store:
        :mod:`~xarray_memchunk.operators.zarr_reads`): a read holds one storage chunk beside
        the block where the block does not hold its chunks as contiguous runs, else nothing.
    making_shares
        What making each of a graph's largest source chunks holds, as a share of making the
        largest, descending
        (:attr:`~xarray_memchunk.operators.production.InputProduction.making_shares`); empty
        where each counts as the largest.
    source_block_count
        Source chunks of a graph, counted (0: not counted; derived from ``source_chunks``,
        which undercounts chunks of uneven lengths).
    """

    name: str
    dims: tuple[str, ...]
    itemsize: int
    kind: InputKind
    source_chunks: Mapping[str, int]
    held_share: float = 0.0
    factors_bytes_per_chunk: float = 0.0
    reads_own_range: bool = False
    produce_bytes: float = 0.0
    produce_held_bytes: float = 0.0
    runtime_bytes: float = 0.0
    serialized_reads: bool = False
    raw_reads: bool = False
    making_shares: tuple[float, ...] = ()
    source_block_count: int = 0


@dataclass(frozen=True)
class DimCut:
    """The candidate chunkings of one dim, as arrays over the candidates being scored.

    Attributes
    ----------
    size
        Length of the dim.
    lengths
        Longest planned chunk.
    n_chunks
        Number of planned chunks.
    padded
        Longest chunk plus its halo (what one task reads).
    units
        Planned chunks are whole multiples of this length.
    halo
        Whether the dim has a halo (it matters only where it is split).
    """

    size: int
    lengths: np.ndarray
    n_chunks: np.ndarray
    padded: np.ndarray
    units: np.ndarray
    halo: bool


@dataclass(frozen=True)
class Footprint:
    """Bytes one task slot needs, by term, per candidate (arrays of the same length)."""

    task: np.ndarray
    gather: np.ndarray
    held: np.ndarray
    factors: np.ndarray
    produce: np.ndarray
    graph: np.ndarray
    runtime: np.ndarray

    #: The terms, in the order plans state them.
    TERMS = ("task", "gather", "held", "factors", "produce", "graph", "runtime")

    @property
    def total(self) -> np.ndarray:
        """What is checked against the per-task budget."""
        return sum((getattr(self, term) for term in self.TERMS), np.zeros_like(self.task))


def _covering(cut: DimCut, source: int, padded: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Extent of the source chunks one planned chunk touches, and whether it equals them.

    ``padded``: the chunk with its halo (what a file read with a halo touches).
    """
    source = min(source, cut.size)
    lengths = cut.padded if padded else cut.lengths
    identical = (cut.lengths == source) & (cut.n_chunks == math.ceil(cut.size / source))
    identical &= (cut.units % source == 0) | (cut.size % source == 0)
    # chunks that are whole multiples of the source chunk start and end on its boundaries
    aligned = (cut.units % source == 0) & ~(padded & (cut.padded > cut.lengths))
    longer = -(-lengths // source) + np.where(aligned, 0, 1)
    # equal chunks (all but the last) that divide the source chunk never straddle two
    equal = -(-cut.size // cut.units) % cut.n_chunks == 0
    shorter = np.where(equal & (source % lengths == 0), 1, 2)
    spans = np.where(lengths >= source, longer, shorter)
    covering = np.where(identical, source, np.minimum(cut.size, spans * source))
    return covering, identical


def _read_group(layout: InputLayout, cuts: Mapping[str, DimCut], padded: np.ndarray) -> np.ndarray:
    """Storage bytes a bounded read of one padded chunk (``padded`` bytes) decodes at once."""
    if layout.reads_own_range:
        return np.minimum(padded, READ_GROUP_BYTES)
    touched = np.full(padded.shape, float(layout.itemsize))
    chunk = float(layout.itemsize)
    for dim in layout.dims:
        source = layout.source_chunks.get(dim, cuts[dim].size)
        touched = touched * _covering(cuts[dim], source, padded=True)[0]
        chunk *= min(source, cuts[dim].size)
    return np.minimum(touched, max(min(READ_GROUP_BYTES, READ_CONCURRENCY * chunk), chunk))


def _raw_read_bytes(layout: InputLayout, cuts: Mapping[str, DimCut]) -> np.ndarray:
    """Bytes a read of raw storage chunks holds beside the block, per candidate.

    Nothing (0) where every storage chunk the padded block touches is a contiguous run of the
    block (read into it in place): the block is whole chunks along every dim, and one chunk
    along every dim but the first. Else one chunk (read into a buffer, its part copied).
    """
    chunk = float(layout.itemsize)
    in_place = np.ones(next(iter(cuts.values())).lengths.shape, dtype=bool)
    for i, dim in enumerate(layout.dims):
        cut = cuts[dim]
        source = min(layout.source_chunks.get(dim, cut.size), cut.size)
        chunk *= source
        whole = _covering(cut, source, padded=True)[0] == np.minimum(cut.padded, cut.size)
        in_place &= whole if i == 0 else whole & (np.minimum(cut.padded, cut.size) == source)
    return np.where(in_place, 0.0, chunk)


def source_blocks(layout: InputLayout, sizes: Mapping[str, int]) -> int:
    """How many source chunks the variable has, its dims of ``sizes``.

    A graph's, counted where its production was measured
    (:attr:`InputLayout.source_block_count`); else from its longest chunks (a file's storage
    chunks), which undercounts chunks of uneven lengths.
    """
    if layout.source_block_count:
        return layout.source_block_count
    return math.prod(
        math.ceil(n / min(layout.source_chunks.get(d, n) or n, n))
        for d in layout.dims
        if (n := sizes[d])
    )


def _source_blocks(layout: InputLayout, cuts: Mapping[str, DimCut]) -> int:
    """:func:`source_blocks` of the variable whose dims ``cuts`` cut."""
    return source_blocks(layout, {d: cuts[d].size for d in layout.dims})


def _making_shares(layout: InputLayout, count: int) -> np.ndarray:
    """Shares of the largest making of the graph's ``count`` largest source chunks.

    Each at its own (:attr:`InputLayout.making_shares`), those past the shares listed at the
    last one listed (they are in descending order); each 1 where none are listed.
    """
    listed = layout.making_shares[:count]
    if not listed:
        return np.ones(count)
    return np.array([*listed, *[listed[-1]] * (count - len(listed))])


def _production(
    layout: InputLayout, cuts: Mapping[str, DimCut], task: np.ndarray, fused: np.ndarray
) -> np.ndarray:
    """What producing a graph's input adds to the task's own peak, per candidate.

    A slot first makes a source chunk (the chunk and what making it needs), then runs the
    operator: where the planned chunk is the source chunk and no halo is gathered (``fused``),
    in the same task, which keeps the graph's inputs to the fused steps until it ends. The
    slot's peak is the larger phase; the term is what it adds to ``task``.
    """
    source = float(layout.itemsize)
    for dim in layout.dims:
        source *= min(layout.source_chunks.get(dim, cuts[dim].size), cuts[dim].size)
    held = np.where(fused, layout.produce_held_bytes, 0.0)
    return production_phases(task, source, layout.produce_bytes, held)


def graph_tasks(layout: InputLayout, cuts: Mapping[str, DimCut]) -> np.ndarray:
    """Tasks of the graph ``apply`` builds for one variable, per candidate (an upper bound).

    A file is read at the planned chunks, halo included: a read and the operator's task per
    chunk. A graph's or an array's chunks are cut from its source chunks (a piece per overlap
    of a source chunk and a planned chunk, and a task per planned chunk that assembles them;
    none where the chunks are its), after the source's own blocks; a stencil split across
    chunks gathers each chunk's halo: a slice of each neighbour along the split halo dims
    (``3^k`` with the chunk's own, for ``k`` of them) and a concatenation; then the operator's
    task.
    """
    own = [cuts[d] for d in layout.dims]
    n_chunks = np.prod([c.n_chunks for c in own], axis=0, dtype=np.float64)
    if layout.kind is InputKind.FILE:
        return 2 * n_chunks
    pieces = n_chunks
    if layout.kind is InputKind.GRAPH:
        pieces = np.ones_like(n_chunks)
        identical = np.ones(n_chunks.shape, dtype=bool)
        for dim, cut in zip(layout.dims, own, strict=True):
            source = min(layout.source_chunks.get(dim, cut.size), cut.size)
            n_source = math.ceil(cut.size / source)
            nested = (cut.lengths % source == 0) | (source % cut.lengths == 0)
            # chunks that nest in the source's (or it in theirs) cut it at its own boundaries
            pieces = pieces * np.where(
                nested, np.maximum(cut.n_chunks, n_source), cut.n_chunks + n_source - 1
            )
            identical &= _covering(cut, source)[1]
        # the source's own blocks, then a rechunk's pieces and its output where it cuts them
        pieces = _source_blocks(layout, cuts) + np.where(identical, 0.0, pieces + n_chunks)
    split = np.sum([(c.n_chunks > 1) & c.halo for c in own], axis=0)
    halos = np.where(split > 0, n_chunks * (3.0**split + 1), 0.0)
    return pieces + halos + n_chunks


def production_phases(
    task: np.ndarray | float,
    block: float,
    making: float,
    held: np.ndarray | float,
) -> np.ndarray:
    """What the larger of a slot's two phases adds to the operator's ``task`` peak.

    Parameters
    ----------
    task
        The operator's predicted peak (its input block included).
    block
        Bytes of the block being made.
    making
        What making it holds beyond the block, at its peak.
    held
        What the operator's task keeps of the input's graph while it runs (0 unless fused).
    """
    task = np.asarray(task, dtype=np.float64)
    return np.maximum(task + held, block + making) - task


def footprint(
    task: np.ndarray,
    cuts: Mapping[str, DimCut],
    layouts: Sequence[InputLayout],
    *,
    threads_per_worker: int,
    n_workers: int,
    device: str = "cpu",
) -> Footprint:
    """The terms of one task slot's memory for each candidate (see the module docstring).

    Parameters
    ----------
    task
        Predicted peak of the operator's task per candidate (the memory model).
    cuts
        The candidates' chunking per dim.
    layouts
        The planned variables; the worst one's extra terms are taken, but for producing
        graphs' chunks, of which a worker's slots make the largest of all the graphs'.
    threads_per_worker, n_workers
        The cluster the plan runs on.
    device
        Where the budget's memory is: on ``"gpu"``, Dask's record of the graph's tasks is in
        the worker's host memory, not the device's, and is left out.
    """
    task = np.asarray(task, dtype=np.float64)
    gather = np.zeros_like(task)
    held = np.zeros_like(task)
    factors = np.zeros_like(task)
    produce = np.zeros_like(task)
    graph = np.zeros_like(task)
    makings: list[np.ndarray] = []  # per graph: what each chunk a worker's slots make adds
    threads = max(1, threads_per_worker)
    for layout in layouts:
        own = [cuts[d] for d in layout.dims]
        padded = np.prod([c.padded for c in own], axis=0, dtype=np.float64) * layout.itemsize
        # a graph's tasks follow its source chunks: a one-chunk source's all go to one worker
        sharing = n_workers
        if layout.kind is InputKind.GRAPH:
            sharing = min(n_workers, _source_blocks(layout, cuts))
        if device != "gpu":  # a GPU's budget is its own memory: the records are the host's
            records = GRAPH_TASK_BYTES * graph_tasks(layout, cuts) / max(1, sharing)
            graph = graph + records / threads
        array_bytes = math.prod(c.size for c in own) * layout.itemsize
        stencil = np.zeros(task.shape, dtype=bool)
        for cut in own:
            if cut.halo:
                stencil |= cut.n_chunks > 1
        waiting = min(array_bytes, layout.held_share * array_bytes / max(1, n_workers))
        n_chunks = np.prod([c.n_chunks for c in own], axis=0, dtype=np.float64)
        # a tree gathers on one worker
        factors = np.maximum(factors, layout.factors_bytes_per_chunk * n_chunks / threads)
        if layout.kind is InputKind.FILE:
            if layout.raw_reads:
                decoding = _raw_read_bytes(layout, cuts)
            else:
                group = _read_group(layout, cuts, padded)
                # reads under a worker-wide lock decode one at a time
                decoding = READ_COPIES * group / (threads if layout.serialized_reads else 1)
            # the read ends before the task's own work starts: it adds only where it is larger
            read = np.maximum(padded + decoding - task, 0.0)
            extra_held = np.full(task.shape, waiting / threads)
            worst = read + extra_held > gather + held
            gather = np.where(worst, read, gather)
            held = np.where(worst, extra_held, held)
            continue
        covering = np.full(task.shape, float(layout.itemsize))
        identical = np.ones(task.shape, dtype=bool)
        merged = np.zeros(task.shape, dtype=bool)
        if layout.kind is InputKind.GRAPH:
            for dim in layout.dims:
                cut = cuts[dim]
                source = layout.source_chunks.get(dim, cut.size)
                span, same = _covering(cut, source)
                covering = covering * span
                identical &= same
                merged |= ~same & (span > min(source, cut.size))
        if layout.kind is InputKind.GRAPH and (layout.produce_bytes or layout.produce_held_bytes):
            # a worker's slots make no more source chunks at once than the graph has, its
            # largest, each once; a fused task that keeps what making its own chunk held
            # counts as the largest's (its share need not bound what it keeps)
            fused = identical & ~stencil
            made = _production(layout, cuts, task, fused)
            shares = _making_shares(layout, min(threads, _source_blocks(layout, cuts)))
            keeps = (fused & (layout.produce_held_bytes > 0))[..., None]
            makings.append(np.where(keeps, 1.0, shares) * made[..., None])
        extra_gather = np.where(stencil | merged, padded, 0.0)
        all_to_all = covering >= array_bytes  # every task reads every source chunk
        ahead = np.where(all_to_all, ALL_TO_ALL_COPIES, threads + HELD_AHEAD)
        cut_sources = np.where(identical, 0.0, ahead * covering)
        share = min(array_bytes, STENCIL_SHARE * array_bytes / max(1, n_workers))
        # the halo slices cut from the neighbours held, each waiting for the task it pads, on
        # the workers the graph's tasks go to
        chunk = np.prod([c.lengths for c in own], axis=0, dtype=np.float64) * layout.itemsize
        on_one = min(array_bytes, STENCIL_SHARE * array_bytes / max(1, sharing))
        halos = np.where(stencil, (padded / chunk - 1) * on_one, 0.0)
        # a worker cannot hold more of the input than all of it (twice, where all reads all)
        most = np.where(all_to_all, ALL_TO_ALL_COPIES * array_bytes, array_bytes)
        extra_held = (
            np.minimum(cut_sources + np.where(stencil, share, 0.0) + waiting, most) + halos
        ) / threads
        worst = extra_gather + extra_held > gather + held
        gather = np.where(worst, extra_gather, gather)
        held = np.where(worst, extra_held, held)
    if makings:  # the slots make the largest of every graph's blocks, each once
        largest = np.sort(np.concatenate(makings, axis=-1), axis=-1)[..., ::-1]
        produce = largest[..., :threads].sum(axis=-1) / threads
    runtime = max((layout.runtime_bytes for layout in layouts), default=0.0)
    return Footprint(
        task=task,
        gather=gather,
        held=held,
        factors=factors,
        produce=produce,
        graph=graph,
        runtime=np.full(task.shape, runtime / threads),
    )

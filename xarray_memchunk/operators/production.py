"""What producing the input costs: one block of the input's own graph, measured.

Data produced by a Dask graph (``standard_normal(...).astype("float32")``, anomalies, a unit
conversion) is produced in the workers, block by block, beside the operator's tasks: a float32
block made from a float64 one holds three times its bytes while it is made. The operator's
memory model knows nothing of that graph. So before planning, one block of the input is
computed in this process (the synchronous scheduler, as a worker's thread would) and its peak
measured (:func:`~xarray_memchunk.models.profiling.measure_peak`, the least of
:data:`MEASUREMENTS`), with what is still held
beside the block when a function fused onto it starts (a ``map_blocks`` probe, fused by Dask's
blockwise optimisation as an operator's first step is).

A task goes through two phases (:mod:`~xarray_memchunk.planning.footprint`): making the block,
which holds the block and what producing it needs at once; then the operator, which frees what
production made and used, except the graph's inputs that the fused task keeps until it ends (a
float64 block cast to float32, with ``astype`` fused into ``map_blocks``). The plan takes the
larger phase, not their sum: summed, the predictions of ``benchmarks/model_accuracy.py
--upstream`` were 17-60% over the measured peaks.

The block measured is the largest one, which the plan must keep room for (in Dask's auto
chunks of a float32 cube made from ``standard_normal``, the short remainder's 36 MiB block held
244 MiB more while it was made, the largest, 128 MiB, 639 MiB more). Where the largest block is
over :data:`MEASURED_BLOCK_BYTES`, a smaller one is measured and what it held scaled to the
largest by bytes (fixed costs scaled with it: an over-estimate, never an under-estimate).

Blocks of one graph differ in size (Dask's auto chunks end in a remainder: 3797 and 802 days
of a 4599-day series), and a worker's task slots make each at most once, so at once they make
no more than the graph's largest blocks. Where the :data:`LISTED_BLOCKS` largest are not all of
the largest's shape, and blocks do not share their production, the graph's smallest block (the
least chunk along every dim) is measured too. What making a block between them holds beyond it
is taken as the smallest's plus ``t`` x the difference to the largest's, ``t`` the farthest
along any dim that the block's length lies from the smallest's toward the largest's: an upper
bound wherever that memory is a sum of products of the block's lengths (a part fixed per block,
a climatology slice growing along lon only, temporaries of the whole block):
:attr:`InputProduction.making_shares`.

Graphs of one layer (data cut from a NumPy array, a random generator) produce a block in place
and are not measured. Results are cached per graph (its name), so planning the same data again
measures nothing. The dask config key ``memchunk.measure-input`` (True) turns it off.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xarray as xr

from .._dask_compat import graph_layers

__all__ = [
    "MEASURED_BLOCK_BYTES",
    "MEASUREMENTS",
    "LISTED_BLOCKS",
    "MAX_BLOCK_SHAPES",
    "InputProduction",
    "explain_productions",
    "input_production",
    "block_shapes",
    "shares_of_making",
    "production_ahead",
    "shares_production",
]

#: Largest block measured in this process; above it, a smaller block is measured and scaled.
MEASURED_BLOCK_BYTES = 256 * 2**20
#: Times the block is produced; the smallest peak is kept. The peak is the process's, and
#: anything else this process allocates meanwhile (a ``LocalCluster``'s scheduler, running in
#: it, as its workers start) or for the first time (NumPy's random generator) only adds to it:
#: a float32 block of 64 MiB made from ``standard_normal`` measured 140 MiB beside it first in
#: a process, 127 MiB every time after, and in the test suite's load up to about 167 MiB.
MEASUREMENTS = 2
#: Most blocks :attr:`InputProduction.making_shares` lists; a worker's slots past them count
#: each as the last listed.
LISTED_BLOCKS = 32
#: Most distinct block shapes weighed for :attr:`InputProduction.making_shares`; a graph of more
#: (chunks of many lengths along several dims) counts each block as the largest.
MAX_BLOCK_SHAPES = 4096

_CACHE: dict[str, InputProduction | None] = {}


@dataclass(frozen=True)
class InputProduction:
    """What producing one block of a variable's input measured.

    Attributes
    ----------
    block_bytes
        The largest block's own bytes.
    extra_bytes
        What producing the largest block holds beyond it, at its peak.
    held_bytes
        What is still held beside the largest block when a function fused onto it starts (the
        graph's inputs a fused task keeps until it ends).
    seconds
        How long producing the blocks measured took (the largest, and the smallest where
        ``making_shares`` needed it).
    measured_bytes
        Bytes of the block measured; where smaller than ``block_bytes``, ``extra_bytes`` and
        ``held_bytes`` are its measurements scaled by ``block_bytes / measured_bytes``.
    shared
        Whether producing the block shares tasks with a neighbouring block
        (:func:`shares_production`): their results stay in a worker until every block that
        needs them is made.
    making_shares
        What making each of the graph's blocks holds (the block and what making it needs), as
        a share of the largest block's, in descending order (:func:`shares_of_making`), at most
        :data:`LISTED_BLOCKS` of them; blocks past them count as the last. Empty where every
        block counts as the largest: the listed blocks all of the largest's shape, blocks that
        share their production, a smallest block too large to measure here or whose
        measurement failed, or more than :data:`MAX_BLOCK_SHAPES` block shapes.
    smallest_bytes, smallest_extra_bytes
        The graph's smallest block and what making it held beyond it, where it was measured
        for ``making_shares`` (else 0).
    block_count
        Blocks of the graph (0 where not counted).
    """

    block_bytes: int
    extra_bytes: int
    held_bytes: int
    seconds: float
    measured_bytes: int = 0
    shared: bool = False
    making_shares: tuple[float, ...] = ()
    smallest_bytes: int = 0
    smallest_extra_bytes: int = 0
    block_count: int = 0

    def explain(self, size: Any = str) -> str:
        """One line for the plan's notes."""
        scaled = (
            f", scaled from a block of {size(self.measured_bytes)}"
            if self.measured_bytes and self.measured_bytes < self.block_bytes
            else ""
        )
        smaller = (
            f"; its smallest block ({size(self.smallest_bytes)}) was measured too, holding "
            f"{size(self.smallest_extra_bytes)} more while it is made: a worker's task slots "
            f"keep room for making the graph's largest blocks at once, each once"
            if self.making_shares
            else ""
        )
        return (
            f"producing one block of the input ({size(self.block_bytes)}{scaled}) was measured "
            f"now, in this process ({self.seconds:.2f} s): it holds {size(self.extra_bytes)} "
            f"more while it is made, and {size(self.held_bytes)} more stays held while an "
            f"operator fused onto it runs; each task slot (a worker thread: it runs one task at "
            f"a time) keeps room for the larger of making the block and running the operator"
            f"{smaller}"
        )


def explain_productions(measured: Mapping[str, InputProduction], size: Any = str) -> str:
    """One note for the measured production of several variables' blocks: the largest figures.

    A Dataset's variables made by one graph each got a note of their own, with near-equal
    figures (a new user's ``tas`` and ``pr`` after ``.where(mask)``: 10.29 and 7.00 MiB more
    while made), which read as the same note repeated.
    """
    if len(measured) == 1:
        return next(iter(measured.values())).explain(size)
    blocks = ", ".join(f"{name} {size(p.block_bytes)}" for name, p in sorted(measured.items()))
    scaled = any(p.measured_bytes and p.measured_bytes < p.block_bytes for p in measured.values())
    extra = max(p.extra_bytes for p in measured.values())
    held = max(p.held_bytes for p in measured.values())
    seconds = sum(p.seconds for p in measured.values())
    smaller = sorted(name for name, p in measured.items() if p.making_shares)
    also = (
        f"; the smallest block of {', '.join(smaller)} was measured too: a worker's task slots "
        f"keep room for making the graphs' largest blocks at once, each once"
        if smaller
        else ""
    )
    return (
        f"producing one block of each variable of the input ({blocks}"
        f"{', some scaled from smaller blocks' if scaled else ''}) was measured now, in this "
        f"process ({seconds:.2f} s): each holds up to {size(extra)} more while it is made, and "
        f"up to {size(held)} more stays held while an operator fused onto it runs; each task "
        f"slot (a worker thread: it runs one task at a time) keeps room for the larger of making "
        f"its block and running the operator{also}"
    )


def _layers(data: Any) -> int:
    return len(graph_layers(data))


def _resident_beside(block: np.ndarray) -> np.ndarray:
    """Resident bytes of this process beyond ``block`` (freed memory handed back first)."""
    from ..models.profiling import release_freed_memory, status_bytes

    release_freed_memory()
    resident = status_bytes("VmRSS") - block.nbytes
    return np.full((1,) * block.ndim, resident, dtype=np.int64)


def _compute_with_probe(data: Any, index: tuple[int, ...], found: list[int]) -> None:
    """Compute block ``index`` of ``data`` synchronously with a probe fused onto it.

    The probe (:func:`_resident_beside`) is mapped over the whole array, as an operator is, and
    then its block taken: mapped over a block taken first, it would not fuse into the task of
    the input's last steps. What it finds resident beyond what stays resident after the
    computation (modules imported and caches filled on the way stay) is what the fused task
    held: appended to ``found``.
    """
    from ..models.profiling import release_freed_memory, status_bytes

    probe = data.map_blocks(
        _resident_beside,
        chunks=tuple((1,) * n for n in data.numblocks),
        dtype=np.int64,
        meta=np.empty((0,) * data.ndim, dtype=np.int64),
    )
    during = int(probe.blocks[index].compute(scheduler="synchronous").ravel()[0])
    release_freed_memory()
    found.append(max(0, during - status_bytes("VmRSS")))


def _blocks_to_measure(data: Any) -> tuple[tuple[int, ...], int]:
    """Index of the block to measure, and the largest block's bytes.

    The largest block, or the middle one where the largest is over
    :data:`MEASURED_BLOCK_BYTES`.
    """
    largest = tuple(int(np.argmax(c)) if c else 0 for c in data.chunks)
    largest_bytes = int(data.blocks[largest].nbytes)
    if largest_bytes <= MEASURED_BLOCK_BYTES:
        return largest, largest_bytes
    return tuple(n // 2 for n in data.numblocks), largest_bytes


def block_shapes(
    chunks: tuple[tuple[int, ...], ...],
) -> list[tuple[tuple[int, ...], int]] | None:
    """The distinct shapes of the non-empty blocks of an array chunked ``chunks``, with counts.

    Returns
    -------
    list or None
        ``(shape, number of blocks of that shape)``; None where there are more than
        :data:`MAX_BLOCK_SHAPES` shapes.
    """
    per_dim = [Counter(n for n in lengths if n > 0) for lengths in chunks]
    if math.prod(len(c) for c in per_dim) > MAX_BLOCK_SHAPES:
        return None
    return [
        (tuple(n for n, _ in combo), math.prod(k for _, k in combo))
        for combo in itertools.product(*(sorted(c.items()) for c in per_dim))
    ]


def shares_of_making(
    shapes: list[tuple[tuple[int, ...], int]],
    itemsize: int,
    largest: tuple[tuple[int, ...], int],
    smallest: tuple[tuple[int, ...], int],
) -> tuple[float, ...]:
    """What making each block holds, as a share of making the largest: descending, at most 1.

    Parameters
    ----------
    shapes
        The blocks' shapes and counts (:func:`block_shapes`).
    itemsize
        Bytes per element.
    largest, smallest
        The shape of the graph's largest block (the longest chunk along every dim) and of its
        smallest (the shortest), each with what making it held beyond the block, measured.

    Returns
    -------
    tuple of float
        One share per block, the largest first, :data:`LISTED_BLOCKS` at most. A block holds
        the smallest's extra plus ``t`` x (the largest's - the smallest's), ``t`` the largest
        over the dims of ``(length - smallest's) / (largest's - smallest's)``: for memory that
        is a sum of products of the lengths with non-negative weights, and ``g(t)`` the extra
        at the smallest's lengths plus ``t`` x the differences, ``g(t) - g(0) <= t (g(1) -
        g(0))``; so too for a peak that is the largest of such sums.
        The largest's extra is taken at least the smallest's (a measurement below it is low).
    """
    (big_shape, big_extra), (small_shape, small_extra) = largest, smallest
    big_extra = max(big_extra, small_extra)
    whole = float(itemsize * math.prod(big_shape) + big_extra)
    weighed = []
    for shape, count in shapes:
        reach = [
            (n - lo) / (hi - lo) if hi > lo else 0.0
            for n, lo, hi in zip(shape, small_shape, big_shape, strict=True)
        ]
        extra = small_extra + max(reach, default=0.0) * (big_extra - small_extra)
        share = (itemsize * math.prod(shape) + extra) / whole
        share = 1.0 if shape == big_shape else min(1.0, share)
        weighed.append((share, count))
    weighed.sort(reverse=True)
    listed: list[float] = []
    for share, count in weighed:
        listed.extend([share] * min(count, LISTED_BLOCKS - len(listed)))
    return tuple(listed)


def shares_production(data: Any, index: tuple[int, ...]) -> bool:
    """Whether producing block ``index`` of ``data`` shares a chunk's task with a neighbour's.

    A graph that splits larger chunks (``.chunk(time=30)`` of one-year file chunks) makes
    each year once, for all the blocks cut from it: a worker keeps it until the last of them
    is made, and may be sent another year's first task meanwhile. Compared along every dim
    with more than one block, the neighbour after ``index`` (or before it, at the end); only
    chunk tasks count (keys of a name and a block index), not the file objects every read
    names.
    """
    graph = dict(data.__dask_graph__())
    own = _chunk_ancestry(graph, (data.name, *index))
    for axis, n in enumerate(data.numblocks):
        if n < 2:
            continue
        other = list(index)
        other[axis] += 1 if index[axis] + 1 < n else -1
        if own & _chunk_ancestry(graph, (data.name, *other)):
            return True
    return False


def _chunk_ancestry(graph: Mapping[Any, Any], key: Any) -> set[tuple]:
    """The chunk tasks (tuple keys) that ``key`` needs, ``key`` itself excepted."""
    from dask.core import get_dependencies

    seen: set[Any] = set()
    stack = [key]
    while stack:
        current = stack.pop()
        if current in seen or current not in graph:
            continue
        seen.add(current)
        task = graph[current]
        needs = getattr(task, "dependencies", None)
        stack.extend(get_dependencies(graph, current) if needs is None else needs)
    seen.discard(key)
    return {k for k in seen if isinstance(k, tuple)}


def production_ahead(threads_per_worker: int) -> float:
    """Blocks' shared production a worker's task slot holds, in one block's: 1 or more.

    Where blocks share their production (:attr:`InputProduction.shared`), a worker keeps what
    they share until the last of them is made, and the scheduler sends it its next root task
    (another year's read) while its threads run: up to ``ceil(threads x worker-saturation)``
    at once (distributed's default 1.1; all of them at ``inf``, counted as two per thread).
    The scheduler's figure where a client is active, else dask's config.
    """
    import dask

    from ..clusters import (
        DEFAULT_SATURATION,
        WORKER_SATURATION_KEY,
        active_client,
        scheduler_queueing,
    )

    client = active_client()
    asked = scheduler_queueing(client) if client is not None else None
    if asked is not None:
        saturation = asked[0]
    else:
        saturation = float(dask.config.get(WORKER_SATURATION_KEY, None) or DEFAULT_SATURATION)
    threads = max(1, threads_per_worker)
    roots = 2 * threads if math.isinf(saturation) else math.ceil(threads * saturation)
    return max(1.0, roots / threads)


def _compute(block: Any) -> None:
    block.compute(scheduler="synchronous")


def _least_of(times: int, data: Any, index: tuple[int, ...]) -> tuple[int, float, list[int]]:
    """The smallest of ``times`` measurements of producing ``data``'s block ``index``.

    Its peak, seconds and what was held beside the block (:func:`_compute_with_probe`).
    """
    from ..models.profiling import measure_peak

    runs = []
    for _ in range(times):
        found: list[int] = []
        peak, seconds, _ = measure_peak(_compute_with_probe, data, index, found)
        runs.append((peak, seconds, found))
    return min(runs, key=lambda run: run[0])


def input_production(da: xr.DataArray) -> InputProduction | None:
    """Measure (once per graph) what producing a block of ``da``'s Dask graph holds.

    Returns None for data not produced by a multi-layer graph, when measuring is turned off,
    and where the block cannot be computed here (data persisted on a cluster: its blocks live in
    the workers).
    """
    import dask

    from ..models.profiling import measure_peak

    data = da.data
    if not dask.config.get("memchunk.measure-input", True):
        return None
    if not (hasattr(data, "dask") and hasattr(data, "numblocks")) or data.ndim == 0:
        return None
    if data.size == 0:  # nothing to produce: planning refuses an empty dim it uses
        return None
    if _layers(data) <= 1:
        return None
    name = str(data.name)
    if name not in _CACHE:
        index, largest = _blocks_to_measure(data)
        block_bytes = int(data.blocks[index].nbytes)
        try:
            peak, seconds, found = _least_of(MEASUREMENTS, data, index)
        except OSError:  # no /proc/self/status to probe: count all of production as held
            peak, seconds, _ = measure_peak(_compute, data.blocks[index])
            found = [max(0, peak - block_bytes)]
        except Exception:  # e.g. persisted keys that only the cluster's workers hold
            _CACHE[name] = None  # not tried again for this graph
            return None
        extra = max(0, peak - block_bytes)
        held = min(found[0], extra)
        scale = largest / block_bytes if block_bytes and largest > block_bytes else 1.0
        measured = InputProduction(
            largest,
            round(extra * scale),
            round(held * scale),
            seconds,
            block_bytes,
            shares_production(data, index),
            block_count=math.prod(data.numblocks),
        )
        _CACHE[name] = _with_smaller_blocks(measured, data)
    return _CACHE[name]


def _with_smaller_blocks(measured: InputProduction, data: Any) -> InputProduction:
    """``measured`` with its making shares, where smaller blocks count.

    Only where the :data:`LISTED_BLOCKS` largest blocks are not all of the largest's shape,
    neither the largest nor the smallest block shares its production, and the smallest is
    small enough to measure here; its measurement failing leaves the shares empty.
    """
    shapes = block_shapes(data.chunks)
    if measured.shared or shapes is None:
        return measured
    big_shape = tuple(max(c) for c in data.chunks)
    largest = sum(k for shape, k in shapes if shape == big_shape)
    if largest >= min(LISTED_BLOCKS, sum(k for _, k in shapes)):  # all listed are the largest
        return measured
    smallest = tuple(
        min((i for i, n in enumerate(c) if n > 0), key=c.__getitem__) for c in data.chunks
    )
    small_bytes = int(data.blocks[smallest].nbytes)
    if small_bytes > MEASURED_BLOCK_BYTES or shares_production(data, smallest):
        return measured
    try:
        peak, seconds, _ = _least_of(MEASUREMENTS, data, smallest)
    except Exception:  # measured on the largest block already: each counts as that one
        return measured
    small_extra = max(0, peak - small_bytes)
    small_shape = tuple(c[i] for c, i in zip(data.chunks, smallest, strict=True))
    shares = shares_of_making(
        shapes,
        data.dtype.itemsize,
        (big_shape, measured.extra_bytes),
        (small_shape, small_extra),
    )
    return replace(
        measured,
        extra_bytes=max(measured.extra_bytes, small_extra),  # less than a smaller block: low
        seconds=measured.seconds + seconds,
        making_shares=shares,
        smallest_bytes=small_bytes,
        smallest_extra_bytes=small_extra,
    )

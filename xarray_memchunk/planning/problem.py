"""The planning problem as plain numbers: dims, their roles, and a task's memory function."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .footprint import InputLayout

__all__ = [
    "DEFAULT_MAX_TASKS",
    "DISTRIBUTED_TASK_OVERHEAD_S",
    "TASK_OVERHEAD_S",
    "DimRole",
    "DimSpec",
    "DimUse",
    "Halo",
    "PeakFunction",
    "PlanProblem",
    "describe_halo",
    "halo_sides",
    "widest_halo",
]

#: A halo's depth: elements read from each neighbour, the same on both sides (a stencil), or
#: ``(before, after)`` along the dim (a trailing moving window reads only the elements before).
Halo = int | tuple[int, int]


def halo_sides(depth: Halo) -> tuple[int, int]:
    """``(before, after)`` of a halo's depth.

    Raises
    ------
    ValueError
        Unless ``depth`` is an int, or a pair of ints, each at least 0.
    """
    sides = tuple(depth) if isinstance(depth, tuple | list) else (depth, depth)
    integers = all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in sides)
    if len(sides) != 2 or not integers or min(sides) < 0:
        raise ValueError(
            f"a halo is an int >= 0 (elements per side) or a pair (before, after) of them, "
            f"got {depth!r}"
        )
    return int(sides[0]), int(sides[1])


def widest_halo(first: Halo, second: Halo) -> Halo:
    """The halo that covers both, side by side: an int where both sides are equal."""
    (b1, a1), (b2, a2) = halo_sides(first), halo_sides(second)
    before, after = max(b1, b2), max(a1, a2)
    return before if before == after else (before, after)


def describe_halo(depth: Halo) -> str:
    """A halo in words: ``"3 per side"``, or ``"29 before, 0 after"``."""
    before, after = halo_sides(depth)
    return f"{before} per side" if before == after else f"{before} before, {after} after"


#: Cost of one chunk's tasks to the thread that runs them under Dask's threaded scheduler,
#: beyond their work, seconds (``python benchmarks/task_overhead.py``: 1.2 ms on 2 cores).
TASK_OVERHEAD_S = 1e-3
#: The same on a distributed cluster: the scheduler, the worker's bookkeeping and the messages
#: between them (``python benchmarks/task_overhead.py``: 9.6-11.2 ms on a 2-core
#: ``LocalCluster``).
DISTRIBUTED_TASK_OVERHEAD_S = 10e-3

#: Maps the padded extents of one task (dim name -> array of extents, one entry per candidate
#: chunk shape) to the predicted peak bytes of that task (array of the same length).
PeakFunction = Callable[[Mapping[str, np.ndarray]], np.ndarray]


#: Most chunks a plan chooses by default (the dask config key ``memchunk.max-tasks``). A plan
#: at a refusal's stated minimum had 2,803,200 tasks of 1 x 48 x 1 elements (a groupby whose
#: input held 1.5 GiB per task whatever its chunks): ``apply`` took 112 s and 5.4 GB in the
#: client, and the estimate was 1.41e4 s. Dask's scheduler handles about 1 ms per task.
DEFAULT_MAX_TASKS = 200_000


class DimRole(StrEnum):
    """How an operator needs a dimension chunked.

    - ``WHOLE``: the dim must be one chunk (the reduced dim of a median, the short side of an SVD).
    - ``HALO``: the dim may be chunked, but each task reads ``depth`` extra elements from each
      neighbour (a stencil; ``(before, after)`` where the sides differ, as for a trailing
      window): chunks must be at least as long as the deeper side.
    - ``FREE``: the dim may be chunked anyhow (a dim the operator maps over).
    """

    WHOLE = "whole"
    HALO = "halo"
    FREE = "free"


@dataclass(frozen=True)
class DimUse:
    """How an operator uses one dim.

    Its :class:`DimRole`, for halo dims the depth (elements per side, or ``(before, after)``:
    a :data:`Halo`), the shortest chunk the operator accepts along it (``min_length``, 0
    for any), and for a free dim the offsets where a chunk may end (``boundaries``, increasing,
    the last the dim's size: a resample's bin edges, so that no bin is cut; empty for
    anywhere). With boundaries, ``min_length`` is the longest span between two of them.
    """

    role: DimRole = DimRole.FREE
    depth: Halo = 0
    min_length: int = 0
    boundaries: tuple[int, ...] = ()


@dataclass(frozen=True)
class DimSpec:
    """One dimension of the array being planned.

    Attributes
    ----------
    name
        Dimension name.
    size
        Length of the dimension, elements.
    role
        How the operator needs it chunked.
    depth
        Halo depth, elements per side or ``(before, after)`` (``HALO`` dims only).
    storage_chunk
        Length of a storage chunk along this dim (on-disk or current dask chunk), if any.
    min_length
        Shortest chunk the operator accepts along this dim, besides a halo's depth (the
        two-pass tsqr's blocks are at least as tall as the matrix is wide).
    boundaries
        Offsets where a chunk may end (see :class:`DimUse`); empty for anywhere. The planner
        prices chunks of a candidate length and then cuts the dim at boundaries only, into
        chunks no longer than that length (:func:`~xarray_memchunk.planning.balance.packed_chunks`).
    """

    name: str
    size: int
    role: DimRole = DimRole.FREE
    depth: Halo = 0
    storage_chunk: int | None = None
    min_length: int = 0
    boundaries: tuple[int, ...] = ()

    @property
    def shortest_chunk(self) -> int:
        """Shortest chunk allowed when the dim is split: a halo's deeper side, ``min_length``."""
        return max(self.halo_depth, self.min_length, 1)

    @property
    def halo_depth(self) -> int:
        """The halo's deeper side (0 where the dim has no halo)."""
        return max(halo_sides(self.depth)) if self.role is DimRole.HALO else 0


@dataclass(frozen=True)
class PlanProblem:
    """Everything the planner needs, and nothing from xarray or distributed.

    Attributes
    ----------
    operator
        Operator name, for messages.
    dims
        The array's dims in order.
    peak_bytes
        Predicted peak bytes of one task from its padded extents (see :data:`PeakFunction`).
    seconds_per_element
        Compute time per padded input element of one task (from the calibration); with
        ``task_overhead_s`` it ranks candidate plans by estimated wall time.
    task_overhead_s
        Cost of one task beyond its work, to the thread that runs it: ~1 ms under the
        threaded scheduler, ~10 ms on a distributed cluster.
    combine_seconds_per_chunk
        Compute time each chunk adds to the steps that combine the tasks' results (tsqr's
        tree of ``R`` factors), taken as serial: Dask's tsqr factors the stacked ``R`` of
        blocks shorter than ``2 n`` rows in one task, and a tree's upper levels have fewer
        tasks than threads.
    read_seconds_per_element
        Time to read (and decompress, or copy when rechunking) one element of storage; a task
        reads whole storage chunks, so chunks that cut across storage chunks read more.
    notes
        Operator remarks carried into the plan's explanation.
    inputs
        The planned variables as they come in (file, Dask graph or NumPy; their chunks): what
        a worker holds besides its tasks depends on them
        (:mod:`~xarray_memchunk.planning.footprint`). None: only the task is counted.
    max_task_elements
        Largest task (padded elements) the memory model was measured on, where it must not
        be extrapolated (a self-calibrated model); None: no such limit.
    task_element_caps
        The same, per variable of a Dataset: ``(dims, elements)``, a cap on the padded
        elements of a chunk over that variable's dims alone (a small ``lat_bnds``'s
        self-calibrated range says nothing of ``tas``'s tasks).
    work_terms
        Per variable of a Dataset, ``(dims, seconds per element)``: a task's work is the sum
        of each variable's seconds times its padded elements over its own dims. Empty: the
        task's padded elements over every dim times :attr:`seconds_per_element`.
    max_extents
        Largest padded extent per dim the memory model was measured on, for dims along which
        it must not be extrapolated (memory grew faster than the block along them).
    max_tasks
        Most operator tasks a chosen plan may have (:data:`DEFAULT_MAX_TASKS`), a task per
        chunk of each variable (:attr:`max_chunks`): where only smaller chunks fit the
        budget, the plan is refused with the memory that fits fewer.
    """

    operator: str
    dims: tuple[DimSpec, ...]
    peak_bytes: PeakFunction
    seconds_per_element: float = 1e-8
    task_overhead_s: float = TASK_OVERHEAD_S
    combine_seconds_per_chunk: float = 0.0
    read_seconds_per_element: float = 2e-9
    notes: tuple[str, ...] = field(default=())
    inputs: tuple[InputLayout, ...] = ()
    max_task_elements: float | None = None
    max_extents: Mapping[str, float] = field(default_factory=dict)
    task_element_caps: tuple[tuple[tuple[str, ...], float], ...] = ()
    work_terms: tuple[tuple[tuple[str, ...], float], ...] = ()
    max_tasks: int = DEFAULT_MAX_TASKS

    @property
    def max_chunks(self) -> int:
        """Most chunks a chosen plan may have: :attr:`max_tasks` shared by its variables."""
        return max(1, self.max_tasks // max(1, len(self.inputs)))

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes of the dims, in order."""
        return tuple(d.size for d in self.dims)

"""Read a file's storage chunks once: stage them where a plan would read each many times.

A plan whose chunks cut across the file's storage chunks reads every storage chunk it touches
in each task that touches it: a median over time of a store in one-day chunks, planned in
blocks of all days x a tenth of the longitudes, decodes every day ten times. Staging the data
(:mod:`~xarray_memchunk.operators.staging`: read once, written to a temporary Zarr store in
chunks chosen for the plan, read back) costs one read of the file, one write and one read of
the store. Where the plan's reads cost more than that by :data:`STAGING_GAIN`, ``apply``
stages the file's variables as it stages a graph's (:func:`reread_seconds`,
:func:`staging_seconds`).

The cost of reading is measured, not assumed: :func:`storage_read_seconds` reads a few storage
chunks of the variable in this process, as a task reads them (decompression included; measured
here on a Zarr store in zstd-compressed one-day chunks of 288 x 720 float32: 8-24 ns per
element), once per variable and store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import xarray as xr

from ..clusters import active_client
from ..errors import InfeasiblePlanError
from ..planning.budget import Budget
from ..planning.footprint import InputKind
from ..planning.plan import ChunkPlan
from ..planning.problem import PlanProblem
from ..units import format_seconds, format_size
from .cost import TaskCost
from .sources import bounded_reads, file_backend
from .staged_plan import StagedPlan, plan_staged
from .staging import staging_site

__all__ = [
    "MEASURED_BYTES",
    "MEASURED_CHUNKS",
    "MIN_REREAD_SECONDS",
    "STAGING_DECODES",
    "STAGING_GAIN",
    "StagingChoice",
    "file_read_seconds",
    "reread_factor",
    "reread_seconds",
    "staged_if_faster",
    "staging_seconds",
    "storage_read_seconds",
]

#: Staging is chosen only where the plan's re-reads cost at least this many times staging.
STAGING_GAIN = 1.5

_READ_SECONDS: dict[tuple[str, str, tuple[int, ...]], float] = {}


#: Storage chunks one measurement reads, along the dim that has most of them; fewer where
#: they would be more than :data:`MEASURED_BYTES` (at least one).
MEASURED_CHUNKS = 8
MEASURED_BYTES = 64 * 2**20


def storage_read_seconds(da: xr.DataArray, storage: Mapping[str, int]) -> float | None:
    """Seconds to read and decode one element of ``da``'s file, as a planned task reads it.

    Reads :data:`MEASURED_CHUNKS` storage chunks (up to :data:`MEASURED_BYTES`) from the middle
    of the array (along the dim that has the most), through the bounded reads the plan's tasks use
    (:func:`~xarray_memchunk.operators.sources.bounded_reads`), twice, and keeps the faster
    read (the first may open the file). Cached per file, variable and storage chunks. None
    where ``da`` is not read from a file, or the read fails.
    """
    backend = file_backend(da.data)
    if backend is None:
        return None
    chunk = tuple(min(int(storage.get(str(d), n)), n) for d, n in da.sizes.items())
    key = (str(da.encoding.get("source", "")), str(da.name), chunk)
    if key not in _READ_SECONDS:
        counts = [math.ceil(n / c) for n, c in zip(da.shape, chunk, strict=True)]
        along = int(np.argmax(counts))
        chunk_bytes = da.dtype.itemsize * math.prod(chunk)
        n_read = max(1, min(MEASURED_CHUNKS, counts[along], MEASURED_BYTES // chunk_bytes))
        region = []
        for axis, (n, c) in enumerate(zip(da.shape, chunk, strict=True)):
            span = c * (n_read if axis == along else 1)
            start = min((n // 2 // c) * c, max(0, n - span))
            region.append(slice(start, min(start + span, n)))
        region = tuple(region)
        elements = math.prod(r.stop - r.start for r in region)
        try:
            reads = bounded_reads(backend, chunk)
            seconds = []
            for _ in range(2):
                began = time.perf_counter()
                np.asarray(reads[region])
                seconds.append(time.perf_counter() - began)
        except Exception:  # an unreadable region: planning goes on without the measure
            return None
        _READ_SECONDS[key] = min(seconds) / max(1, elements)
    return _READ_SECONDS[key]


def file_read_seconds(
    costs: Mapping[str, TaskCost], targets: Mapping[str, xr.DataArray]
) -> float | None:
    """Seconds to read one element of the planned files, the slowest's (measured, cached).

    The time model's ``read_seconds_per_element``: a plan whose chunks cut a compressed
    file's storage chunks decodes them in every task that cuts them, at this rate (8-24 ns per
    element for a zstd Zarr store, against the 2 ns of a copy in memory). Each plan that
    reads a file measures it here (:func:`storage_read_seconds`: once per file, variable and
    storage chunks), unless planned with ``measure="never"``; the rate then stands for every
    input's storage reads. None where no variable is read from a file in its storage chunks,
    or no read could be measured.
    """
    measured = [
        storage_read_seconds(targets[n], c.layout.source_chunks)
        for n, c in _read_in_storage_chunks(costs).items()
    ]
    return max((s for s in measured if s is not None), default=None)


def _read_in_storage_chunks(costs: Mapping[str, TaskCost]) -> dict[str, TaskCost]:
    """The variables read from a file whose tasks decode whole storage chunks."""
    return {
        n: c
        for n, c in costs.items()
        if c.layout.kind is InputKind.FILE and not c.layout.reads_own_range
    }


def _touched(chunks: Sequence[int], storage: int, size: int) -> int:
    """Storage elements along one dim that reading each of ``chunks`` touches, in all."""
    storage = min(storage, size)
    touched, start = 0, 0
    for length in chunks:
        first, last = start // storage, (start + length - 1) // storage
        touched += min((last + 1) * storage, size) - first * storage
        start += length
    return touched


def reread_factor(plan: ChunkPlan, cost: TaskCost) -> float:
    """Storage elements the plan's tasks read in all, per element of the variable.

    1.0 where every storage chunk is read once (the plan's chunks are whole storage chunks,
    or lie within them); halos are left out (they read little).
    """
    storage = cost.layout.source_chunks
    factor = 1.0
    for dim in cost.dims:
        size = cost.sizes[dim]
        factor *= _touched(plan.dask_chunks[dim], storage.get(dim, size), size) / size
    return factor


def reread_seconds(plan: ChunkPlan, cost: TaskCost, per_element: float) -> float:
    """Seconds the plan spends reading the variable's file beyond one read, on all its cores."""
    elements = math.prod(cost.sizes[d] for d in cost.dims)
    extra = (reread_factor(plan, cost) - 1.0) * elements
    return extra * per_element / plan.budget.compute_slots


#: Decoding time (per element, as the file's) that staging spends beyond one read of the file:
#: reading the store back (it is stored uncompressed: :data:`~.staging.UNCOMPRESSED`; the staged
#: quantile's tasks took 3.4 s reading it back and computing, against 4.3 s from a zstd store).
STAGING_DECODES = 1.0


def staging_seconds(
    cost: TaskCost, per_element: float, bytes_per_second: float, threads: int
) -> float:
    """Seconds staging the variable adds beyond one read of the file, on ``threads`` threads.

    The store is written through the staging disk (``bytes_per_second``, its measured write
    speed, shared by all threads) and read back (:data:`STAGING_DECODES` x ``per_element``,
    spread over the threads).
    """
    elements = math.prod(cost.sizes[d] for d in cost.dims)
    nbytes = elements * cost.dtype.itemsize
    return nbytes / bytes_per_second + STAGING_DECODES * elements * per_element / threads


#: Re-reads below this many seconds are not worth measuring the staging disk for.
MIN_REREAD_SECONDS = 2.0


class StagingChoice(NamedTuple):
    """Whether a plan stages its files (:func:`staged_if_faster`), and if not, why not.

    Attributes
    ----------
    staged
        The plan with the files staged; None where the plan in memory stands.
    why_not
        Where the files were weighed for staging and are not staged, the figures that decided
        it, for the plan's notes; ``""`` where staging was not weighed (no file re-read, or
        re-reads too short to weigh) or where the files are staged.
    """

    staged: StagedPlan | None
    why_not: str = ""


def staged_if_faster(
    costs: Mapping[str, TaskCost],
    targets: Mapping[str, xr.DataArray],
    plan: ChunkPlan,
    problem: PlanProblem,
    budget: Budget,
) -> StagingChoice:
    """The plan with the files staged, where the plan in memory re-reads them for longer.

    Compares the seconds the plan ``plan`` spends reading the files' storage chunks beyond one
    read (:func:`reread_seconds`) with what staging adds (:func:`staging_seconds`, the disk
    measured); stages where the first is at least :data:`STAGING_GAIN` times the second and a
    staged plan fits. Where it does not, the choice says why (the figures compared), so that a
    plan that re-reads its files says what staging would have cost.
    """
    files = _read_in_storage_chunks(costs)
    threads = budget.compute_slots
    reread, per_element, factors, unmeasured = 0.0, {}, {}, []
    for name, cost in files.items():
        factor = reread_factor(plan, cost)
        if factor <= 1.0:
            continue
        seconds = storage_read_seconds(targets[name], cost.layout.source_chunks)
        if seconds is None:
            unmeasured.append(name)
        else:
            per_element[name], factors[name] = seconds, factor
            reread += reread_seconds(plan, cost, seconds)
    if not per_element and unmeasured:
        return StagingChoice(
            None,
            f"not staged, though the plan in memory reads the storage chunks of "
            f"{', '.join(unmeasured)} more than once: reading them could not be measured",
        )
    if not per_element:
        return StagingChoice(None)

    def rereads(verb: str = "reads") -> str:
        return (
            f"the plan in memory {verb} the storage chunks of {', '.join(per_element)} "
            f"{max(factors.values()):.1f} times over (its chunks "
            f"cut them; measured at {1e9 * max(per_element.values()):.1f} ns per element: about "
            f"{format_seconds(reread)} of reads beyond a single read)"
        )

    if reread < MIN_REREAD_SECONDS:
        return StagingChoice(
            None,
            f"not staged: {rereads()}, under the {format_seconds(MIN_REREAD_SECONDS)} of "
            f"re-reads that staging is weighed for",
        )

    nbytes = sum(files[n].dtype.itemsize * math.prod(files[n].sizes.values()) for n in per_element)
    site = staging_site(nbytes, active_client())
    if site.refusal or not site.bytes_per_second:
        where = site.refusal or f"{site.directory} could not be measured"
        return StagingChoice(None, f"not staged, though {rereads()}: {where}")
    staging = sum(
        staging_seconds(files[n], s, site.bytes_per_second, threads) for n, s in per_element.items()
    )
    if reread < STAGING_GAIN * staging:
        return StagingChoice(
            None,
            f"not staged: {rereads()}, and reading them once and staging them would cost about "
            f"{format_seconds(staging)} (the staging disk written at "
            f"{format_size(site.bytes_per_second)}/s): staging is chosen where the re-reads "
            f"cost {STAGING_GAIN:g} times as much",
        )
    why = (
        f"{rereads('would read')}, where reading them once and staging them costs about "
        f"{format_seconds(staging)}"
    )
    try:
        staged = plan_staged(
            costs,
            problem,
            budget,
            InfeasiblePlanError(why),
            variables=tuple(per_element),
            why=why,
        )
    except InfeasiblePlanError as refused:
        return StagingChoice(
            None, f"not staged, though {rereads()}: no staged plan fits ({refused})"
        )
    return StagingChoice(staged)

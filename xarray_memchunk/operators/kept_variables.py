"""A Dataset's variables that an operator keeps without planning them: their tasks sized.

A built-in operator keeps some variables it does not apply to, as xarray does: a groupby or
resample broadcasts a variable without the grouped dim along the groups or bins (a
3-D ocean depth ``deptho(lev, lat, lon)`` becomes ``deptho(month, lev, lat, lon)``, all
months in one chunk), and ``std`` over time computes zeros from a variable without time, in
float64 moments. xarray computes them in tasks beside the plan's, on the chunks the variable
has: a static field opened with ``open_mfdataset`` is one chunk, the whole variable. Measured
(``benchmarks/kept_variables.py``) on one-thread workers: written to Zarr, a broadcast chunk
peaks at 1.9x its output (the broadcast made contiguous, then encoded); ``std``'s zeros at
14x their input.

So each such variable that Dask computes is sized here at plan time: xarray's work on a small
sample of it (every dim it lacks whole, its own cut to :data:`SAMPLE_ELEMENTS`) is run under
``tracemalloc`` and gives the bytes one task holds per byte of its input chunk. Where its chunks
would not fit :data:`KEPT_SHARE` of the per-task budget, they are cut (its own dims first,
those it shares with the planned variables last), and ``apply`` reads or rechunks it so, as it
does a planned variable.
NumPy-backed variables are computed by xarray in the calling process at ``apply``, not by the
workers, and are left as they are.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

if TYPE_CHECKING:
    from ..planning.budget import Budget
    from .base import Operator
    from .dims import DimUse

__all__ = ["KEPT_SHARE", "NOTE_SHARE", "SAMPLE_ELEMENTS", "KeptVariable", "size_kept_variables"]

#: Elements of the sample of a kept variable that xarray's work is measured on: small enough to
#: take milliseconds, large enough that NumPy's fixed costs do not count.
SAMPLE_ELEMENTS = 1 << 18
#: The share of the per-task budget a task on a kept variable may take. The sample's
#: ``tracemalloc`` sees NumPy's allocations, not what the worker holds beside the task (a
#: Dataset built from NumPy data carries its chunks in the graph): a resample of a 19.8 MiB
#: ``deptho`` broadcast along 24 months, 2 workers x 1 thread x 1 GB, paused a worker with its
#: tasks sized to the whole slot (390 MiB measured, 413 MiB predicted), and ran without a pause
#: in 2 of 2 runs sized to half of it (196 MiB measured).
KEPT_SHARE = 0.5
#: A kept variable gets a plan note where its chunks are cut, or where its task takes at least
#: this share of its slot: a 1.4 kB ``lat_bnds`` said 8011x its chunk (the fixed cost of any
#: computation, 11 MiB), which only made the notes longer.
NOTE_SHARE = 0.1


@dataclass(frozen=True)
class KeptVariable:
    """What one task of xarray's work on a kept variable holds, and the chunks that fit.

    Attributes
    ----------
    name
        The variable's name.
    bytes_per_input_byte
        What such a task holds (its input chunk, xarray's work on it, its result made
        contiguous and encoded once) per byte of its input chunk: measured on a sample.
    task_bytes
        What one task holds on the variable's largest chunk as ``apply`` gives it.
    chunks
        The chunks (a length per dim) ``apply`` gives the variable so that a task fits
        :data:`KEPT_SHARE` of the per-task budget; None where its own chunks fit.
    """

    name: str
    bytes_per_input_byte: float
    task_bytes: int
    chunks: dict[str, int] | None = None

    def worth_noting(self, budget: Budget) -> bool:
        """Whether the plan's notes say what a task on it holds (:data:`NOTE_SHARE`)."""
        slot = KEPT_SHARE * budget.per_task
        return self.chunks is not None or self.task_bytes >= NOTE_SHARE * slot

    def note(self, budget: Budget) -> str:
        """The plan's note on this variable: what a task holds, and the chunks given to it."""
        size = budget.format
        held = (
            f"{self.name}: xarray's task on one of its chunks holds about "
            f"{size(self.task_bytes)}: the chunk, xarray's work on it and its result written "
            f"once, {self.bytes_per_input_byte:.1f}x the chunk (measured on a sample)"
        )
        slot = f"{KEPT_SHARE:.0%} of the per-task budget, {size(KEPT_SHARE * budget.per_task)}"
        if self.chunks is None:
            return f"{held}, within {slot}"
        cut = ", ".join(f"{d}: {n}" for d, n in self.chunks.items())
        if self.task_bytes > KEPT_SHARE * budget.per_task:
            return f"{held}: over {slot}, even chunked {cut}"
        return f"{held}, once chunked {cut} so that it fits {slot}"


def size_kept_variables(
    ds: xr.Dataset,
    operator: Operator,
    uses: Mapping[str, Mapping[str, DimUse]],
    kwargs: Mapping[str, Any],
    budget: Budget,
) -> dict[str, KeptVariable]:
    """Size xarray's tasks on the variables of ``ds`` that ``operator`` keeps unplanned.

    ``uses`` names the planned variables (as ``apply`` passes them to
    :meth:`~xarray_memchunk.operators.base.Operator.compute_dataset`), ``kwargs`` the
    operator's bound arguments. Returns the Dask-backed kept variables, by name; an operator
    that leaves every unplanned variable out
    (:attr:`~xarray_memchunk.operators.base.Operator.keeps_unplanned_variables` False: a user's
    function is not run on stand-ins) gives none.
    """
    unplanned = [n for n in operator.kept_unplanned(ds, uses, **kwargs) if ds[n].chunks]
    sized = {}
    for name in unplanned:
        ratio = _bytes_per_input_byte(ds, name, operator, uses, kwargs)
        if ratio is not None:
            slot = int(KEPT_SHARE * budget.per_task)
            sized[name] = _fitted(ds[name], ratio, slot, _planned_dims(ds, uses))
    return sized


def _planned_dims(ds: xr.Dataset, uses: Mapping[str, Any]) -> set[str]:
    return {str(d) for name in uses for d in ds[name].dims}


def _sample(ds: xr.Dataset, name: str) -> xr.Dataset:
    """``ds`` with the dims of ``name`` cut to a sample and every variable's data a stand-in.

    The kept variable's stand-in is allocated (zeros, so that its input does not count in what
    xarray's work allocates); the others are Dask's lazy zeros, never computed.
    """
    import dask.array

    var = ds[name]
    extents = dict(zip(map(str, var.dims), var.shape, strict=True))
    while math.prod(extents.values()) > SAMPLE_ELEMENTS:
        longest = max(extents, key=extents.__getitem__)
        extents[longest] = max(1, extents[longest] // 2)
    cut = ds.isel({d: slice(0, n) for d, n in extents.items()})
    stand_ins = {}
    for key, v in cut.data_vars.items():
        if str(key) == name:
            data = dask.array.from_array(np.zeros(v.shape, v.dtype), chunks=-1)
        else:
            data = dask.array.zeros(v.shape, dtype=v.dtype, chunks=-1)
        stand_ins[key] = v.copy(data=data)
    return cut.assign(stand_ins)


def _bytes_per_input_byte(
    ds: xr.Dataset,
    name: str,
    operator: Operator,
    uses: Mapping[str, Mapping[str, DimUse]],
    kwargs: Mapping[str, Any],
) -> float | None:
    """What xarray's task on ``name`` holds per byte of its input chunk; None if left out.

    Measured on a sample (:func:`_sample`): the input, the peak that ``tracemalloc`` saw while
    the result was computed and made contiguous, and that result once more (encoded for a
    store, or sent to another worker).
    """
    sample = _sample(ds, name)
    result = operator.compute_dataset(sample, uses, **kwargs)
    if name not in result.data_vars or result[name].chunks is None:
        return None
    lazy = result[name].data
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = np.ascontiguousarray(lazy.compute(scheduler="sync"))
        work = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    held = sample[name].nbytes + work + out.nbytes
    return held / max(1, sample[name].nbytes)


def _fitted(da: xr.DataArray, ratio: float, per_task: int, planned_dims: set[str]) -> KeptVariable:
    """The variable's largest task, and chunks cut to fit ``per_task`` where it does not fit.

    Its own dims are cut first, the longest first; dims it shares with planned variables
    last, so that where it can, it keeps their chunks.
    """
    chunk = {str(d): max(c) if c else 0 for d, c in zip(da.dims, da.chunks, strict=True)}
    itemsize = da.dtype.itemsize

    def held(extents: Mapping[str, int]) -> int:
        return int(ratio * itemsize * math.prod(extents.values()))

    name = str(da.name)
    if held(chunk) <= per_task:
        return KeptVariable(name, ratio, held(chunk))
    order = sorted(chunk, key=lambda d: (d in planned_dims, -chunk[d]))
    for dim in order:
        others = held(chunk) // max(1, chunk[dim])
        chunk[dim] = max(1, min(chunk[dim], per_task // max(1, others)))
        if held(chunk) <= per_task:
            break
    return KeptVariable(name, ratio, held(chunk), chunk)

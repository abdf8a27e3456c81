"""SEG-Y to Zarr (or netCDF), with storage chunks chosen for the operator that comes next.

A SEG-Y file stores whole traces one after the other, so any (inline, crossline) box is a
set of runs of consecutive traces, but a time slice touches every trace. Zarr stores chunks,
and which chunks suit depends on what reads them:

- for an operator (``operator="gst3d"``): the chunks memchunk plans for it on this volume
  and budget, found as a fixed point: the plan for a store chunked like this is this
  chunking, so ``apply`` reads whole storage chunks (and halos from their neighbours);
- otherwise ``DEFAULT_CHUNK`` = 128 along every dim (capped at the dim): MDIO's choice for
  post-stack volumes, a balance between reading inlines, crosslines, time slices and bricks.

The write runs one task per column of storage chunks (whole traces, so each trace is read
once); a column larger than a quarter of the per-task budget is cut along samples into whole
storage chunks. Each task reads its traces in runs, so no task holds more than its column.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError

__all__ = ["DEFAULT_CHUNK", "check_source", "ingest", "storage_chunks_for", "write_chunks"]

#: Storage chunk length along every dim when no operator is named (MDIO's post-stack default).
DEFAULT_CHUNK = 128
#: Copies of its block a write task holds at its peak: the block read, one storage chunk
#: being encoded beside it, and the run of traces being read (bounded by the block).
WRITE_COPIES = 4
#: Plans tried before settling on storage chunks for an operator.
FIXED_POINT_ROUNDS = 4


def _with_storage(da: xr.DataArray, chunks: Mapping[str, int]) -> xr.DataArray:
    """``da`` as if it were stored in ``chunks`` (what the planner reads from the encoding)."""
    view = da.copy(deep=False)
    view.encoding = dict(da.encoding) | {"preferred_chunks": dict(chunks)}
    return view


def storage_chunks_for(
    da: xr.DataArray,
    operator: str | None = None,
    *,
    memory_limit: Any = None,
    **operator_kwargs: Any,
) -> tuple[dict[str, int], str]:
    """Storage chunks for ``da`` when ``operator`` will read it, and why.

    Parameters
    ----------
    da
        The volume (e.g. from :func:`~xarray_memchunk.io.open_segy`).
    operator
        The operator the store is for; None for :data:`DEFAULT_CHUNK` along every dim.
    memory_limit
        As :func:`xarray_memchunk.plan` takes it (a size, a Budget, or None to discover).
    **operator_kwargs
        The operator's options.

    Returns
    -------
    chunks, reason
        Chunk length per dim, and a sentence saying how they were chosen.
    """
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    if operator is None:
        chunks = {d: min(DEFAULT_CHUNK, n) for d, n in sizes.items()}
        return chunks, f"{DEFAULT_CHUNK} along every dim (no operator named)"
    chunks = dict.fromkeys(sizes, 1)  # any chunking is aligned: the operator's own choice
    # The store does not exist yet, so a built-in operator's plan measures nothing: a read
    # probe would time the SEG-Y file in storage chunks it does not have (of 1 element, in
    # the first round) and take that rate for the store's. Measured so, gst3d's plan on a
    # 600^3 file chose 600 x 600 x 100 storage chunks: ingest 3.5-6.1 s and gst3d after it
    # 14.6-15.7 s, against 2.4-3.0 s and 12.9-13.6 s in the 300^3 chunks it plans so.
    from ..operators.registry import get_operator, is_builtin

    measure = "never" if is_builtin(get_operator(operator)) else "auto"
    for _ in range(FIXED_POINT_ROUNDS):
        plan = _with_storage(da, chunks).memchunk.plan(
            operator, memory_limit=memory_limit, measure=measure, **operator_kwargs
        )
        if plan.chunks == chunks:
            break
        chunks = dict(plan.chunks)
    settled = "" if plan.chunks == chunks else f" (not settled in {FIXED_POINT_ROUNDS} plans)"
    return chunks, (
        f"{operator}'s planned chunks{settled}: predicted peak per task "
        f"{plan.budget.format(plan.predicted_peak_bytes)} of "
        f"{plan.budget.format(plan.budget.per_task)}"
    )


def write_chunks(
    sizes: Mapping[str, int],
    storage: Mapping[str, int],
    itemsize: int,
    per_task: int,
    along: str,
) -> dict[str, tuple[int, ...]]:
    """Dask chunks for writing: one storage chunk across, as many as fit along ``along``.

    Every chunk is a whole number of storage chunks (the last of a dim excepted), so no two
    tasks write one storage chunk.

    Parameters
    ----------
    sizes, storage
        Length and storage chunk length per dim.
    itemsize
        Bytes per element.
    per_task
        Bytes one task may use; a task's block is at most ``per_task / WRITE_COPIES`` unless a
        single storage chunk is larger.
    along
        The dim to gather storage chunks along (a SEG-Y file's samples: whole traces).
    """
    across = int(np.prod([storage[d] for d in sizes if d != along]))
    fit = max(1, per_task // WRITE_COPIES // max(1, across * storage[along] * itemsize))
    lengths = {d: storage[d] * (fit if d == along else 1) for d in sizes}
    return {d: _pieces(n, min(lengths[d], n)) for d, n in sizes.items()}


def _pieces(n: int, length: int) -> tuple[int, ...]:
    full, rest = divmod(n, length)
    return (length,) * full + ((rest,) if rest else ())


def check_source(source: str | os.PathLike) -> None:
    """Refuse a ``source`` that :func:`ingest` cannot read, by its suffix.

    Raises
    ------
    MemchunkError
        When ``source`` is not named as a SEG-Y file.
    """
    from .segy import SEGY_SUFFIXES

    if Path(source).suffix.lower() not in SEGY_SUFFIXES:
        raise MemchunkError(
            f"ingest reads SEG-Y files ({', '.join(sorted(SEGY_SUFFIXES))}), not "
            f"{str(source)!r}; a Zarr or netCDF input can be planned and run as it is"
        )


def ingest(
    source: str | os.PathLike,
    target: str | os.PathLike,
    *,
    operator: str | None = None,
    memory_limit: Any = None,
    overwrite: bool = False,
    compute: Callable[[Any], None] | None = None,
    segy_options: Mapping[str, Any] | None = None,
    **operator_kwargs: Any,
) -> tuple[Path, dict[str, int], str]:
    """Convert a SEG-Y file to a Zarr store (or netCDF file, by suffix), safely.

    Parameters
    ----------
    source
        The SEG-Y file.
    target
        The store to write; written under a hidden name and moved into place when complete
        (:func:`~xarray_memchunk.io.safe_write`).
    operator
        Choose storage chunks for this operator (:func:`storage_chunks_for`).
    memory_limit
        One worker's memory limit (or a Budget), as :func:`~xarray_memchunk.api.plan` takes
        it: with no active ``distributed.Client``, this process's, shared by Dask's threads
        (``memchunk ingest`` plans for the workers it starts); None: discovered.
    overwrite
        Replace ``target`` if it exists.
    compute
        Runs the delayed write (e.g. on a client, with a progress bar); ``dask.compute``
        by default.
    segy_options
        Passed to :func:`~xarray_memchunk.io.open_segy` (``fill``, ``iline``, ``endian``...).
    **operator_kwargs
        The operator's options.

    Returns
    -------
    target, storage chunks, reason
        The path written, its chunk length per dim, and how they were chosen.
    """
    from ..io import check_target, safe_write
    from ..memory_limits import resolve_budget
    from .segy import open_segy

    check_source(source)
    segy_options = dict(segy_options or {})
    da = open_segy(source, **segy_options)
    check_target(target, overwrite, sources=[source])
    budget = resolve_budget(memory_limit)
    storage, reason = storage_chunks_for(da, operator, memory_limit=budget, **operator_kwargs)
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    chunks = write_chunks(sizes, storage, da.dtype.itemsize, budget.per_task, along="sample")
    result = open_segy(source, **segy_options, chunks=chunks)  # each task reads its block
    result.encoding = {}
    written = safe_write(
        result,
        target,
        overwrite=overwrite,
        compute=compute,
        storage_chunks=storage,
        sources=[source],
    )
    return written, storage, reason

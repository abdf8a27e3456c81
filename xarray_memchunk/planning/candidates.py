"""Candidate chunkings of one dimension: counts of balanced chunks, not free sizes.

A count's longest and shortest chunks are the balanced ones'; the plan lays the chosen count
out as Zarr's regular chunks where that keeps both (:func:`.search._chunks_of`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .balance import max_chunk, min_chunk
from .problem import DimRole, DimSpec, Halo, halo_sides

__all__ = ["DimCandidates", "dim_candidates", "padded_extent"]


@dataclass(frozen=True)
class DimCandidates:
    """The chunkings considered for one dim, as parallel arrays.

    Attributes
    ----------
    n_chunks
        Number of balanced chunks.
    lengths
        Longest chunk, elements.
    padded
        Longest chunk plus its halo, elements (what one task reads).
    units
        Storage-chunk length the chunks are whole multiples of (1: element-wise split).
    aligned
        Whether every chunk is a whole number of storage chunks.
    touched
        Elements of storage a task must read to get its padded chunk: whole storage chunks,
        one more where a chunk straddles a storage boundary.
    """

    n_chunks: np.ndarray
    lengths: np.ndarray
    padded: np.ndarray
    units: np.ndarray
    aligned: np.ndarray
    touched: np.ndarray

    def __len__(self) -> int:
        return len(self.n_chunks)


def padded_extent(length: np.ndarray | int, n_chunks: np.ndarray | int, depth: Halo):
    """Extent one task reads along a dim: the chunk plus its halo from each interior neighbour.

    One chunk has no neighbour (no halo); of two chunks, the first reads ``after`` elements of
    the second and the second ``before`` of the first; three or more give the interior chunks
    both. Dask's ``map_overlap(boundary="none")`` pads exactly so.
    """
    before, after = halo_sides(depth)
    n_chunks = np.asarray(n_chunks)
    extra = np.where(n_chunks >= 3, before + after, np.where(n_chunks == 2, max(before, after), 0))
    return np.asarray(length) + extra


def _split_counts(n_units: int, keep: int) -> np.ndarray:
    """Counts 1..n_units that give distinct longest chunks, thinned geometrically to ``keep``."""
    if n_units <= 200_000:
        counts = np.arange(1, n_units + 1)
        lengths = -(-n_units // counts)  # ceil division
        # the fewest chunks for each distinct longest-chunk length
        counts = -(-n_units // np.unique(lengths))
    else:
        counts = np.unique(np.geomspace(1, n_units, 4 * keep).round().astype(np.int64))
    counts = np.unique(counts)
    if len(counts) > keep:
        picks = np.unique(np.geomspace(1, len(counts), keep).round().astype(np.int64) - 1)
        counts = counts[picks]
    return counts


def dim_candidates(dim: DimSpec, keep: int) -> DimCandidates:
    """List the chunkings of ``dim`` worth considering, at most about ``2 * keep`` of them.

    Whole dims have one candidate (one chunk). Other dims get element-wise balanced splits and,
    when a storage chunk shorter than the dim is known, splits into whole storage chunks. Only
    splits whose shortest chunk is at least :attr:`DimSpec.shortest_chunk` are kept: a halo's
    depth, as ``dask.array.map_overlap`` requires, or the operator's ``min_length``.
    """
    size = dim.size
    storage = min(dim.storage_chunk, size) if dim.storage_chunk else None
    if dim.role is DimRole.WHOLE or size <= 1:
        return DimCandidates(
            n_chunks=np.array([1]),
            lengths=np.array([size]),
            padded=np.array([size]),
            units=np.array([storage or 1]),
            aligned=np.array([True]),
            touched=np.array([size]),
        )
    rows: list[tuple[int, int, int, bool]] = []
    for unit in (1, storage) if storage and storage < size else (1,):
        n_units = math.ceil(size / unit)
        for n in _split_counts(n_units, keep):
            n = int(n)
            if n > 1 and min_chunk(size, n, unit) < dim.shortest_chunk:
                continue
            aligned = unit == storage or storage is None or n == 1
            rows.append((n, max_chunk(size, n, unit), unit, aligned))
    rows = sorted(set(rows))
    n_chunks = np.array([r[0] for r in rows], dtype=np.int64)
    lengths = np.array([r[1] for r in rows], dtype=np.int64)
    aligned = np.array([r[3] for r in rows], dtype=bool)
    padded = padded_extent(lengths, n_chunks, dim.depth if dim.role is DimRole.HALO else 0)
    return DimCandidates(
        n_chunks=n_chunks,
        lengths=lengths,
        padded=padded,
        units=np.array([r[2] for r in rows], dtype=np.int64),
        aligned=aligned,
        touched=_touched(padded, aligned, storage, size),
    )


def _touched(padded: np.ndarray, aligned: np.ndarray, storage: int | None, size: int):
    """Storage elements read per task along one dim (see :class:`DimCandidates`)."""
    if not storage:
        return padded
    spans = -(-padded // storage) + np.where(aligned & (padded % storage == 0), 0, 1)
    return np.minimum(size, spans * storage)

"""Balanced chunk tuples: split a length into ``n`` near-equal chunks, optionally in storage units.

200 in 2 chunks is ``(100, 100)``, never ``(159, 41)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["balanced_chunks", "max_chunk", "min_chunk", "packed_chunks"]


def balanced_chunks(size: int, n_chunks: int, unit: int = 1) -> tuple[int, ...]:
    """Split ``size`` elements into ``n_chunks`` chunks of near-equal length.

    Parameters
    ----------
    size
        Length of the dimension, elements.
    n_chunks
        Number of chunks, 1 <= n_chunks <= ceil(size / unit).
    unit
        Every chunk but the last is a multiple of ``unit`` (a storage chunk length), so each
        task reads whole storage chunks. ``unit=1`` splits element by element.

    Returns
    -------
    tuple of int
        Chunk lengths summing to ``size``, longest first.

    Examples
    --------
    >>> balanced_chunks(200, 2)
    (100, 100)
    >>> balanced_chunks(1000, 3, unit=100)
    (400, 300, 300)
    """
    if size <= 0:
        return (0,)
    n_units = math.ceil(size / unit)
    if not 1 <= n_chunks <= n_units:
        raise ValueError(f"cannot split {size} into {n_chunks} chunks of whole units of {unit}")
    base, extra = divmod(n_units, n_chunks)
    units = [base + 1] * extra + [base] * (n_chunks - extra)
    lengths = [u * unit for u in units]
    lengths[-1] -= n_units * unit - size  # the last storage chunk may be partial
    return tuple(lengths)


def max_chunk(size: int, n_chunks: int, unit: int = 1) -> int:
    """Longest chunk of :func:`balanced_chunks`, without building the tuple."""
    return math.ceil(math.ceil(size / unit) / n_chunks) * unit if n_chunks > 1 else size


def min_chunk(size: int, n_chunks: int, unit: int = 1) -> int:
    """Shortest (last) chunk of :func:`balanced_chunks`, without building the tuple."""
    if n_chunks <= 1:
        return size
    n_units = math.ceil(size / unit)
    return (n_units // n_chunks) * unit - (n_units * unit - size)


def packed_chunks(boundaries: Sequence[int], longest: int) -> tuple[int, ...]:
    """Cut a dim at ``boundaries`` only, into chunks of at most ``longest`` elements.

    Spans between boundaries (a resample's bins) are packed greedily, as many per chunk as
    fit: every chunk holds whole spans.

    Parameters
    ----------
    boundaries
        Increasing offsets where a chunk may end; the last is the dim's size.
    longest
        Longest chunk allowed, at least the longest span.

    Raises
    ------
    ValueError
        When a span is longer than ``longest``.

    Examples
    --------
    >>> packed_chunks([31, 59, 90, 120], 60)
    (59, 31, 30)
    >>> packed_chunks([31, 59, 90, 120], 61)
    (59, 61)
    """
    chunks: list[int] = []
    start = previous = 0
    for edge in boundaries:
        if edge - previous > longest:
            raise ValueError(f"a span of {edge - previous} is longer than chunks of {longest}")
        if edge - start > longest:
            chunks.append(previous - start)
            start = previous
        previous = edge
    chunks.append(previous - start)
    return tuple(chunks)

"""Balanced chunk tuples: split a length into ``n`` near-equal chunks, optionally in storage units.

200 in 2 chunks is ``(100, 100)``, never ``(159, 41)``.
"""

from __future__ import annotations

import math

__all__ = ["balanced_chunks", "max_chunk", "min_chunk"]


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

"""Merge how several variables use their dims into one :class:`DimSpec` per dim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .problem import DimRole, DimSpec, DimUse, widest_halo

__all__ = ["merge_dims"]

_STRICTNESS = {DimRole.FREE: 0, DimRole.HALO: 1, DimRole.WHOLE: 2}


def merge_dims(
    variables: Sequence[
        tuple[Sequence[str], Mapping[str, int], Mapping[str, DimUse], Mapping[str, int | None]]
    ],
) -> tuple[DimSpec, ...]:
    """One spec per dim, over every planned variable, in order of first appearance.

    Parameters
    ----------
    variables
        ``(dims, sizes, uses, storage_chunks)`` per variable; dims a variable's ``uses`` leave
        out are free for it.

    Returns
    -------
    tuple of DimSpec
        The strictest role any variable gives a dim (whole over halo over free), the deepest
        halo, the longest ``min_length``, the first storage chunk length known, and the
        boundaries every variable allows.
    """
    specs: dict[str, DimSpec] = {}
    for dims, sizes, uses, storage in variables:
        for dim in dims:
            use = uses.get(dim, DimUse())
            old = specs.get(dim)
            role = use.role
            if old is not None and _STRICTNESS[old.role] > _STRICTNESS[role]:
                role = old.role
            depth = widest_halo(use.depth, old.depth if old else 0)
            shortest = max(use.min_length, old.min_length if old else 0)
            chunk = (old.storage_chunk if old else None) or storage.get(dim)
            boundaries = _common_boundaries(use.boundaries, old.boundaries if old else ())
            specs[dim] = DimSpec(dim, int(sizes[dim]), role, depth, chunk, shortest, boundaries)
    return tuple(specs.values())


def _common_boundaries(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """Offsets where both allow a chunk to end (either's where the other allows anywhere)."""
    if not first or not second:
        return first or second
    return tuple(sorted(set(first) & set(second)))

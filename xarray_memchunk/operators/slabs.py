"""Walk a block in small slabs, so that a temporary made per slab stays small."""

from __future__ import annotations

import math
from collections.abc import Iterator

__all__ = ["slabs"]


Index = tuple[int | slice, ...]


def slabs(shape: tuple[int, ...], kept: int, max_elements: int) -> Iterator[Index]:
    """Indices over the first ``kept`` axes of ``shape``; each slab they select is a view.

    A slab holds at most ``max_elements`` elements, or one whole series (the axes after the
    first ``kept``) when a series is longer.
    """
    row = math.prod(shape[1:])
    if kept == 1 or row <= max_elements:
        step = max(1, max_elements // max(1, row))
        for start in range(0, shape[0], step):
            yield (slice(start, start + step),)
        return
    for i in range(shape[0]):
        for rest in slabs(shape[1:], kept - 1, max_elements):
            yield (i, *rest)

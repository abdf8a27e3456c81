"""What the exact SVD's two tsqr algorithms share: one side whole, the other chunked.

Tall-and-skinny QR (tsqr) needs the shorter side of the stacked matrix whole and the longer
one chunked; only the first dim of the longer side is chunked (stacking a chunked trailing dim
would make Dask rechunk). Data in memory is decomposed by NumPy's (or CuPy's) SVD at once.
The two algorithms are :mod:`~xarray_memchunk.operators.svd.one_pass` (Dask's tsqr) and
:mod:`~xarray_memchunk.operators.svd.two_pass` (memchunk's).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ...planning.problem import DimRole
from ..base import DimUse
from .algorithm import Alternative, SVDAlgorithm

__all__ = ["TALL_BLOCKS", "ExactSVD"]

#: ``(time, space)`` of the tall single blocks, 0.2 to 40 MB, that calibration profiles.
TALL_BLOCKS = (
    (500, 100),
    (2000, 100),
    (1000, 400),
    (5000, 300),
    (4000, 800),
    (20000, 200),
    (10000, 1000),
    (8000, 1200),
)


class ExactSVD(SVDAlgorithm):
    """An exact SVD by tsqr: the longer side chunked along its first dim, the shorter whole."""

    method: ClassVar[str] = "exact"
    calibration_sizes: ClassVar[tuple[tuple[int, int], ...]] = TALL_BLOCKS

    def alternative(self, kwargs: dict[str, Any]) -> Alternative:
        """``exact SVD (<name> tsqr)``, with ``method="exact"`` and ``tsqr=`` its name."""
        return (
            f"exact SVD ({self.name} tsqr)",
            kwargs | {"method": self.method, "tsqr": self.name},
            "",
        )

    def shortest_block(self, n: int, rest: int) -> int:
        """Fewest elements of the chunked dim in a block; none by default.

        Parameters
        ----------
        n
            The shorter side of the matrix.
        rest
            Elements of the longer side's other dims (whole) per element of the chunked one.
        """
        return 0

    def chunked_dims(
        self, sizes: Mapping[str, int], samples: Sequence[str], features: Sequence[str]
    ) -> dict[str, DimUse]:
        """The first dim of the longer side (the samples when the sides are equal)."""
        n_samples = math.prod(sizes[d] for d in samples)
        n_features = math.prod(sizes[d] for d in features)
        long_side = samples if n_samples >= n_features else features
        rest = math.prod(sizes[d] for d in long_side[1:])
        shortest = self.shortest_block(min(n_samples, n_features), rest)
        return {long_side[0]: DimUse(DimRole.FREE, min_length=shortest)}

    def decompose(self, data: Any, xp: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """NumPy's (CuPy's) SVD of data in memory; :meth:`decompose_lazy` of a Dask array."""
        if not hasattr(data, "dask"):
            return xp.linalg.svd(xp.asarray(data), full_matrices=False)
        return self.decompose_lazy(data)

    @abc.abstractmethod
    def decompose_lazy(self, data: Any) -> tuple[Any, Any, Any]:
        """Thin SVD ``(U, S, V^H)`` of a Dask array chunked along its longer side only."""

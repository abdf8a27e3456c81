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

import xarray as xr

from ...planning.problem import DimRole
from ..base import DimUse
from ..sources import device_of
from .algorithm import Alternative, SVDAlgorithm, matrix_shape

__all__ = ["QR_COPY_COLUMNS", "TALL_BLOCKS", "ExactSVD"]

#: Columns of QR that copying and casting a block cost per element: on this project's CPU the
#: ``svd-cpu`` profiles' time per element (blocks of 2000 rows or more, n = 200 to 1200
#: columns) fits 65 + 0.20 n ns (float32) and 90 + 0.18 n ns (float64), an offset of 330 and
#: 500 columns, and the ``svd-two-pass`` ones 160 to 250: a task's work per element is taken
#: as ``n + QR_COPY_COLUMNS``, a rounded value for both algorithms.
QR_COPY_COLUMNS = 256

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

    def time_terms(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The time terms of tsqr on ``da`` (:class:`~xarray_memchunk.operators.base.Cost`'s).

        On a CPU a QR's time per element grows with the matrix's shorter side ``n``
        (``work_per_element``: ``n`` plus :data:`QR_COPY_COLUMNS`), and each block adds its
        ``n x n`` ``R`` factor to the tree that combines them (``combine_elements_per_chunk``),
        so that plans of many short blocks pay for their tree. No terms (an empty dict) on a
        GPU, whose time per element did not follow ``n`` (the ``svd-gpu`` profiles, 400 to
        2400 columns).
        """
        if device_of(da) == "gpu":
            return {}
        sample_dims = kwargs.get("sample_dims")

        def work(sizes: Mapping[str, int]) -> float:
            return float(min(matrix_shape(sizes, sample_dims)) + QR_COPY_COLUMNS)

        n = min(matrix_shape({str(d): int(m) for d, m in da.sizes.items()}, sample_dims))
        return {"work_per_element": work, "combine_elements_per_chunk": float(n * n)}

    def decompose(self, data: Any, xp: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """NumPy's (CuPy's) SVD of data in memory; :meth:`decompose_lazy` of a Dask array."""
        if not hasattr(data, "dask"):
            return xp.linalg.svd(xp.asarray(data), full_matrices=False)
        return self.decompose_lazy(data)

    @abc.abstractmethod
    def decompose_lazy(self, data: Any) -> tuple[Any, Any, Any]:
        """Thin SVD ``(U, S, V^H)`` of a Dask array chunked along its longer side only."""

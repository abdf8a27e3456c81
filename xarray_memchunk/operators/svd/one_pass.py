"""Exact SVD by Dask's tsqr (``dask.array.linalg.svd``): one pass, every block's ``Q`` held.

Per-task memory (the features of the model):

- ``block_bytes``: the largest matrix one task decomposes: a block, or the stacked ``R``
  factors that tsqr decomposes in one task (``blocks x min(rows, n)`` rows of ``n``),
  whichever is larger. tsqr recurses, bounding the stack by one block's rows, only for blocks
  of at least ``2 n`` rows, so short blocks make one task decompose a matrix as large as the
  input;
- ``square_bytes``: ``n x n`` (``R``, the small SVD).

Dask's tsqr reads the input once but holds every block's float64 ``Q`` factor until the QR
of the stacked ``R`` factors is done: the whole matrix in float64 (:data:`TSQR_HELD_SHARE`).
Its tasks run LAPACK in float64; calibrated as ``svd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ..base import Cost
from .exact import ExactSVD

__all__ = ["TSQR_HELD_SHARE", "OnePassTsqr"]

#: tsqr keeps every block's first Q factor (the size of the whole matrix) until the QR of the
#: stacked R factors is done, and each output block until it is used: a worker held 839 MB for
#: a 640 MB float64 matrix on 2 workers (benchmarks/plan_safety.py).
TSQR_HELD_SHARE = 1.25


class OnePassTsqr(ExactSVD):
    """Dask's tsqr: one pass over the input, the whole matrix held in float64 meanwhile."""

    name: ClassVar[str] = "one-pass"
    selected_by: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        product(("auto", "exact"), ("auto", "one-pass"))
    )
    calibration: ClassVar[str] = "svd"
    #: LAPACK QR/SVD in float64, a copy, Q and workspace: ~9x a float32 block.
    default_coefficients: ClassVar[Mapping[str, float]] = {
        "block_bytes": 9.0,
        "square_bytes": 12.0,
    }

    def block_features(
        self, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], itemsize: int
    ) -> dict[str, np.ndarray]:
        """``block_bytes`` (a block or the stacked ``R`` factors) and ``square_bytes``."""
        total_rows, total_cols = shape
        tall = total_rows >= total_cols
        chunk, n, total = (rows, cols, total_rows) if tall else (cols, rows, total_cols)
        blocks = np.ceil(total / chunk)
        stacked_rows = blocks * np.minimum(chunk, n)
        stacked_rows = np.where(chunk >= 2 * n, np.minimum(stacked_rows, chunk), stacked_rows)
        return {
            "block_bytes": np.maximum(chunk, stacked_rows) * n * itemsize,
            "square_bytes": n * n * itemsize,
        }

    def cost(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> Cost:
        """One task per block, calibration ``svd``, tsqr's ``Q`` factors held, its tree timed."""
        return self.matrix_cost(
            da, kwargs, held_share=TSQR_HELD_SHARE, **self.time_terms(da, kwargs)
        )

    def decompose_lazy(self, data: Any) -> tuple[Any, Any, Any]:
        """``dask.array.linalg.svd``."""
        import dask.array

        return dask.array.linalg.svd(data)

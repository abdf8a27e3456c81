"""Exact SVD by memchunk's two-pass tsqr: only ``n x n`` factors held, the input read twice.

The graph is :func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd`. Between its passes it
holds only ``n x n`` factors per block (``factors_bytes_per_chunk``,
:func:`~xarray_memchunk.operators.svd.tsqr.held_bytes_per_block`), against Dask's one-pass
tsqr that holds the whole matrix in float64.

Per-task memory: its tasks are of two kinds that never run at once for one plan's peak: a
block's (it stacks no ``R`` factors) and an ``n x n`` factor's (the tree's QRs, the SVD). The
feature ``task_bytes`` is the larger, the factor's counted as :data:`SQUARE_TASK_BLOCKS` blocks
of its size. Blocks are at least ``n`` rows tall, so that every node of the tree takes LAPACK's
``tpqrt``. Calibrated as ``svd-two-pass``.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ..base import Cost
from ..sources import device_of
from .algorithm import matrix_shape
from .exact import TALL_BLOCKS, ExactSVD
from .tsqr import held_bytes_per_block, two_pass_svd

__all__ = ["SQUARE_TASK_BLOCKS", "TWO_PASS_TASKS", "TwoPassTsqr"]

#: An ``n x n`` factor's task (the tree's QR, the SVD of the last R) in blocks of its size, for
#: the two-pass tsqr: NumPy's SVD (LAPACK gesdd, float64) of a 2000 x 2000 float32 R peaked at
#: 18.5 times R's bytes, a block's task at 5.0 times the block's (``svd-two-pass`` profiles;
#: the process's resident memory grew by 17.6 times R's bytes in a check on 2026-11-22).
SQUARE_TASK_BLOCKS = 3.7
#: Dask tasks per row block of the two-pass tsqr: both passes' block tasks, the tree's up and
#: down steps and their getters, the re-read input and its binding; 13.0 and 13.1 per block in
#: Dask's optimized graph of ``U``, ``S`` and ``V`` (8 and 32 blocks, 2-D input).
TWO_PASS_TASKS = 13.0


class TwoPassTsqr(ExactSVD):
    """memchunk's two-pass tsqr: two reads of the input, only ``n x n`` factors held."""

    name: ClassVar[str] = "two-pass"
    selected_by: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        product(("auto", "exact"), ("auto", "two-pass"))
    )
    calibration: ClassVar[str] = "svd-two-pass"
    #: The block, its float64 copy, Q times M: 6x a float32 block.
    default_coefficients: ClassVar[Mapping[str, float]] = {"task_bytes": 6.0}
    #: Square blocks (its SVD is their largest task), then the tall blocks of the exact SVD.
    calibration_sizes: ClassVar[tuple[tuple[int, int], ...]] = (
        (1000, 1000),
        (2000, 1500),
        (2500, 2000),
        *TALL_BLOCKS,
    )

    def shortest_block(self, n: int, rest: int) -> int:
        """Blocks of at least ``n`` rows, so that every node of the tree takes ``tpqrt``."""
        return -(-n // rest)

    def block_features(
        self, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], itemsize: int
    ) -> dict[str, np.ndarray]:
        """``task_bytes``: a block or :data:`SQUARE_TASK_BLOCKS` ``n x n``, the larger."""
        n = min(shape)
        square = SQUARE_TASK_BLOCKS * n * n * itemsize
        return {"task_bytes": np.maximum(rows * cols * itemsize, square)}

    def cost(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> Cost:
        """Two passes, :data:`TWO_PASS_TASKS` tasks per block, the tree's factors held.

        The factors held per block are
        :func:`~xarray_memchunk.operators.svd.tsqr.held_bytes_per_block` of ``da``'s dtype (a
        dense tree for CuPy data).
        """
        sizes = {str(d): int(m) for d, m in da.sizes.items()}
        n = min(matrix_shape(sizes, kwargs.get("sample_dims")))
        held = held_bytes_per_block(n, np.dtype(da.dtype), device_of(da) == "gpu")
        return self.matrix_cost(
            da,
            kwargs,
            passes=2,
            tasks_per_chunk=TWO_PASS_TASKS,
            factors_bytes_per_chunk=held,
            **self.time_terms(da, kwargs),
        )

    def decompose_lazy(self, data: Any) -> tuple[Any, Any, Any]:
        """:func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd` of a tall or wide array."""
        if data.shape[0] >= data.shape[1]:
            return two_pass_svd(data)
        # A^T = U' S V'^H  =>  A = (V'^H)^T S (U')^T
        u_t, s, vh_t = two_pass_svd(data.T)
        return vh_t.T, s, u_t.T

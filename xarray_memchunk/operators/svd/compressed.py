"""Compressed (randomized) SVD, ``dask.array.linalg.svd_compressed``: both sides chunked.

The first dim of each side of the stacked matrix is chunked, the others stay whole. Each of
the ``2 n_power_iter + 2`` passes multiplies every block by a thin matrix.

Per-task memory: a task holds its block and 2-5% more (measured on blocks of 4 to 320 MB); the
sketch (a block's rows and columns times ``k + n_oversamples``) is under 1% of a block in any
plan, and as a feature of its own it took part of the block's slope in the fit and
under-predicted large blocks, so the block (``block_bytes``) is its only feature. Its tasks are
matrix products in the input's dtype; calibrated as ``svd-compressed``.

On a ``distributed`` cluster whose workers have room, the input is produced once and held
between the passes (:func:`holds_input`); otherwise each pass produces it again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ...clusters import ClusterFacts
from ...planning.problem import DimRole
from ..arrays import array_module
from ..base import Cost, DimUse
from .algorithm import Alternative, SVDAlgorithm

__all__ = [
    "COMPRESSED_ITERATOR",
    "COMPRESSED_TASK_BLOCKS",
    "HOLD_MARGIN",
    "CompressedSVD",
    "holds_input",
]

#: ``svd_compressed``'s power iterations re-orthonormalize (tsqr) after every product. Dask's
#: default, ``"power"``, multiplies ``(A A^T)^q A`` out first: a singular value ``s_i`` then
#: weighs ``(s_i / s_1)^(2q + 1)`` against the first, and below the dtype's precision it is
#: lost. On a float32 temperature field (365 x 259200, ``s_2 / s_1 = 0.018``) ``"power"`` with
#: ``q = 2`` gave ``s_2`` 18% too small, silently, and ``q = 4`` overflowed; ``"QR"`` gave it to
#: 1e-6 for every ``q``, at about 25% more tasks.
COMPRESSED_ITERATOR = "QR"
#: Blocks per thread a worker needs beside a held input: the running compressed-SVD task
#: (1.02x its block, the ``svd-compressed`` calibration) and the next block, produced beside it.
COMPRESSED_TASK_BLOCKS = 2.0
#: Share of the workers' free room the held input of a compressed SVD may take: Dask does not
#: place the input's blocks evenly.
HOLD_MARGIN = 0.8


class CompressedSVD(SVDAlgorithm):
    """The randomized SVD of ``k`` components: every block read ``2 n_power_iter + 2`` times."""

    name: ClassVar[str] = "compressed"
    method: ClassVar[str] = "compressed"
    #: Tried by ``method="auto"`` whatever ``tsqr=`` (it chooses among the exact algorithms);
    #: ``method="compressed"`` takes no ``tsqr=``.
    selected_by: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {("auto", "auto"), ("auto", "one-pass"), ("auto", "two-pass"), ("compressed", "auto")}
    )
    needs_k: ClassVar[bool] = True
    calibration: ClassVar[str] = "svd-compressed"
    #: The block and products with thin matrices, ~1.1x a block (3x here).
    default_coefficients: ClassVar[Mapping[str, float]] = {"block_bytes": 3.0}
    #: Blocks of 4 to 160 MB (float32).
    calibration_sizes: ClassVar[tuple[tuple[int, int], ...]] = (
        (1000, 1000),
        (2000, 3000),
        (4000, 2000),
        (3000, 6000),
        (6000, 4000),
        (5000, 8000),
        (8000, 5000),
        (10000, 4000),
    )

    def alternative(self, kwargs: dict[str, Any]) -> Alternative:
        """``compressed SVD (k=...)``; without ``k``, a way that cannot be taken, and why."""
        if kwargs["k"] is None:
            return (
                "compressed SVD",
                None,
                "no k was given for svd_compressed: pass k= (components to keep) so that "
                "method='auto' can fall back to the compressed SVD, which chunks both dims",
            )
        return (f"compressed SVD (k={kwargs['k']})", kwargs | {"method": self.method}, "")

    def chunked_dims(
        self, sizes: Mapping[str, int], samples: Sequence[str], features: Sequence[str]
    ) -> dict[str, DimUse]:
        """The first dim of each side."""
        return {samples[0]: DimUse(DimRole.FREE), features[0]: DimUse(DimRole.FREE)}

    def block_features(
        self, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], itemsize: int
    ) -> dict[str, np.ndarray]:
        """``block_bytes``: one block of the input."""
        return {"block_bytes": rows * cols * itemsize}

    def cost(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> Cost:
        """The sketch, two passes per power iteration and the projection.

        ``2 n_power_iter + 2`` passes; ``6 + 5 n_power_iter`` tasks per block, counted in
        Dask's optimized graph of 4x4 to 8x8 blocks with :data:`COMPRESSED_ITERATOR` (6.2, 10.7
        and 16.2 per block for 0, 1 and 2 power iterations; ``tests/test_svd.py`` checks it).
        """
        q = kwargs["n_power_iter"]
        return self.matrix_cost(da, kwargs, passes=2 * q + 2, tasks_per_chunk=6.0 + 5.0 * q)

    def decompose(self, data: Any, xp: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """``svd_compressed`` of ``k`` components; data in memory as one block."""
        import dask.array

        lazy = hasattr(data, "dask")
        if not lazy:  # in-memory data: the same randomized algorithm, on one block
            data = dask.array.from_array(xp.asarray(data), chunks=data.shape)
        return dask.array.linalg.svd_compressed(
            data,
            kwargs["k"],
            iterator=COMPRESSED_ITERATOR,
            n_power_iter=kwargs["n_power_iter"],
            n_oversamples=kwargs["n_oversamples"],
            seed=_random_state(kwargs["seed"], xp),
            compute=lazy and not _input_fits_in_workers(data),
        )


def _random_state(seed: int, xp: Any) -> Any:
    """The ``seed`` that ``svd_compressed`` takes for data of array module ``xp``.

    CuPy data gets a CuPy random state, so the sketch is made on the device; NumPy data the
    seed itself (Dask's NumPy generator).
    """
    if xp is np:
        return seed
    import dask.array

    return dask.array.random.RandomState(seed, RandomState=xp.random.RandomState)


def holds_input(nbytes: int, block_bytes: int, facts: ClusterFacts, spill_line: float) -> bool:
    """Whether a compressed SVD may keep its input in the workers' memory between passes.

    Kept (``svd_compressed(compute=False)``), the input is produced once and held until the last
    pass uses it. Dask spills a worker's data to disk from ``spill_line`` of its memory limit,
    so the input is kept only when each worker's share of it, plus its running tasks and the
    memory it uses now, stays under that line (with :data:`HOLD_MARGIN` for uneven placement).
    Otherwise each pass produces the input again (``compute=True``): slower, and never more
    memory than the plan. Workers without a memory limit get the second, safe choice.
    """
    if not facts.memory_limit:
        return False
    tasks = COMPRESSED_TASK_BLOCKS * block_bytes * facts.threads_per_worker
    room = spill_line * facts.memory_limit - facts.largest_process_memory - tasks
    return nbytes <= HOLD_MARGIN * facts.n_workers * max(0.0, room)


def _input_fits_in_workers(data: Any) -> bool:
    """:func:`holds_input` for a Dask array on the active client's workers.

    Without a client (Dask's threaded scheduler), never: the scheduler would hold the whole
    input in this process (or on its GPU) between passes, beyond what the plan budgets. On an
    H100 a compressed SVD of a 4 GB input planned for 2 GiB of device memory held 4.5 GiB so.
    Nor for CuPy data: the workers' memory limits describe host memory, not their GPUs'.
    """
    from ...clusters import active_client, cluster_facts, memory_threshold

    client = active_client()
    if client is None or array_module(data._meta) is not np:
        return False
    line = memory_threshold("target", "spill", "pause", otherwise=1.0)
    block_bytes = data.dtype.itemsize * math.prod(max(c) for c in data.chunks)
    return holds_input(int(data.nbytes), block_bytes, cluster_facts(client), line)

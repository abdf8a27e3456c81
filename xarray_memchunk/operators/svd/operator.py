"""SVD and EOF/PCA: exact (tall-and-skinny QR) and compressed (randomized) SVD.

The DataArray is stacked to 2-D: ``sample`` (the ``sample_dims``, e.g. time) by ``feature``
(every other dim, e.g. lat x lon). ``dask.array.linalg.svd`` (tsqr) needs one side whole and the
other chunked; ``svd_compressed`` chunks both. Only the first dim of each stacked side may be
chunked (stacking a chunked trailing dim would make Dask rechunk).

Per-task memory (the features of the model):

- ``block_bytes``: the largest matrix one task decomposes or multiplies. For the exact SVD
  that is a block, or the stacked R factors that tsqr decomposes in one task (``blocks x
  min(rows, n)`` rows of ``n``), whichever is larger; tsqr recurses, bounding the stack by one
  block's rows, only for blocks of at least ``2 n`` rows, so short blocks make one task
  decompose a matrix as large as the input. For the compressed SVD, one block of the input,
  which each of its ``2 n_power_iter + 2`` passes multiplies by a thin matrix;
- ``square_bytes`` (exact): ``n x n`` (R, the small SVD).

The exact SVD runs in one of two ways (``tsqr=``). Dask's tsqr makes one pass but holds every
block's float64 ``Q`` factor until the QR of the stacked ``R`` factors is done: the whole matrix
in float64 (:data:`TSQR_HELD_SHARE`). The two-pass tsqr
(:func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd`) holds only ``n x n`` factors per block
(``held_per_chunk``) and reads the input twice. Its tasks are of two kinds that never run at
once for one plan's peak: a block's (it stacks no ``R`` factors) and an ``n x n`` factor's (the
tree's QRs, the SVD); the feature ``task_bytes`` is the larger, the factor's counted as
:data:`SQUARE_TASK_BLOCKS` blocks of its size. Calibrated as ``svd-two-pass``.
``tsqr="auto"`` plans the one-pass tsqr when it fits and the two-pass one when only that fits.

A compressed-SVD task holds its block and 2-5% more (measured on blocks of 4 to 320 MB); the
sketch (a block's rows and columns times ``k + n_oversamples``) is under 1% of a block in any
plan, and as a feature of its own it took part of the block's slope in the fit and
under-predicted large blocks, so the block is its only feature.

The two methods are calibrated separately (``svd`` and ``svd-compressed``): tsqr's tasks run
LAPACK in float64, the compressed SVD's tasks are matrix products in the input's dtype.

EOF naming: ``V``'s modes are the spatial patterns (EOFs), ``U`` the principal components
(time series), ``S`` the singular values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import xarray as xr
from xarray.indexes import PandasMultiIndex

from ...clusters import ClusterFacts
from ...errors import DimensionError, MemchunkError
from ...models import LinearMemoryModel
from ...planning.problem import DimRole
from ..arguments import check_number, reject_unknown
from ..arrays import array_module
from ..base import CostTerms, DimUse, Operator
from ..dims import resolve_dims
from ..slabs import slabs
from .tsqr import held_bytes_per_block, two_pass_svd

__all__ = ["SVD"]

METHODS = ("auto", "exact", "compressed")
#: ``svd_compressed``'s power iterations re-orthonormalize (tsqr) after every product. Dask's
#: default, ``"power"``, multiplies ``(A A^T)^q A`` out first: a singular value ``s_i`` then
#: weighs ``(s_i / s_1)^(2q + 1)`` against the first, and below the dtype's precision it is
#: lost. On a float32 temperature field (365 x 259200, ``s_2 / s_1 = 0.018``) ``"power"`` with
#: ``q = 2`` gave ``s_2`` 18% too small, silently, and ``q = 4`` overflowed; ``"QR"`` gave it to
#: 1e-6 for every ``q``, at about 25% more tasks.
COMPRESSED_ITERATOR = "QR"
#: How the exact SVD runs tsqr: Dask's (one pass, every block's Q held) or
#: :func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd` (two passes, only n x n factors held).
TSQR_MODES = ("auto", "one-pass", "two-pass")
#: tsqr keeps every block's first Q factor (the size of the whole matrix) until the QR of the
#: stacked R factors is done, and each output block until it is used: a worker held 839 MB for
#: a 640 MB float64 matrix on 2 workers (benchmarks/plan_safety.py).
TSQR_HELD_SHARE = 1.25
#: Blocks per thread a worker needs beside a held input: the running compressed-SVD task
#: (1.02x its block, the ``svd-compressed`` calibration) and the next block, produced beside it.
COMPRESSED_TASK_BLOCKS = 2.0
#: An ``n x n`` factor's task (the tree's QR, the SVD of the last R) in blocks of its size, for
#: the two-pass tsqr: NumPy's SVD (LAPACK gesdd, float64) of a 2000 x 2000 float32 R peaked at
#: 18.5 times R's bytes, a block's task at 5.0 times the block's (``svd-two-pass`` profiles;
#: the process's resident memory grew by 17.6 times R's bytes in a check on 2026-11-22).
SQUARE_TASK_BLOCKS = 3.7
#: Dask tasks per row block of the two-pass tsqr: both passes' block tasks, the tree's up and
#: down steps and their getters, the re-read input and its binding; 13.0 and 13.1 per block in
#: Dask's optimized graph of ``U``, ``S`` and ``V`` (8 and 32 blocks, 2-D input).
TWO_PASS_TASKS = 13.0
#: Share of the workers' free room the held input of a compressed SVD may take: Dask does not
#: place the input's blocks evenly.
HOLD_MARGIN = 0.8


def _sides(da: xr.DataArray, sample_dims) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if sample_dims is None:
        raise DimensionError(
            f"svd needs sample_dims=, e.g. sample_dims=('time',); dims are {tuple(da.dims)}"
        )
    samples = resolve_dims(da, sample_dims)
    features = tuple(str(d) for d in da.dims if d not in samples)
    if not features:
        raise DimensionError(f"svd needs at least one feature dim besides {samples}")
    return samples, features


class SVD(Operator):
    """Singular value decomposition of a DataArray stacked to (sample, feature).

    Other Parameters
    ----------------
    sample_dims : str or sequence of str
        Dims stacked into rows (names or CF axes, e.g. ``"T"``); every other dim is a feature.
    method : {"auto", "exact", "compressed"}
        ``"auto"`` (default) uses exact SVD when an exact plan fits the budget, else
        compressed with ``k``; without ``k`` and no exact plan it raises
        :class:`~xarray_memchunk.InfeasiblePlanError`.
    k : int, optional
        Components to keep (required for ``"compressed"``).
    n_power_iter, n_oversamples, seed
        ``dask.array.linalg.svd_compressed`` parameters (defaults 2, 10, 0). Dask's own
        default is ``n_power_iter=0``: a third of the passes, less accurate when the
        singular values decay slowly.
    tsqr : {"auto", "one-pass", "two-pass"}
        How the exact SVD runs. ``"one-pass"``: ``dask.array.linalg.svd``, which holds every
        block's ``Q`` factor (the whole matrix in float64) until the end. ``"two-pass"``: only
        ``n x n`` factors are held and each block is read and factored twice (about twice the
        compute). ``"auto"`` (default): one pass when it fits, else two.
    """

    name = "svd"
    description = "SVD / EOF: exact (tsqr, one side whole) or compressed (randomized), planned"
    default_seconds_per_element = 2e-8

    #: tsqr and the randomized SVD run on NumPy (LAPACK) and CuPy (cuSOLVER, cuBLAS) blocks.
    devices = ("cpu", "gpu")

    def normalize_kwargs(
        self,
        sample_dims: str | Sequence[str] | None = None,
        method: str = "auto",
        k: int | None = None,
        n_power_iter: int = 2,
        n_oversamples: int = 10,
        seed: int = 0,
        tsqr: str = "auto",
        **unknown: Any,
    ) -> dict[str, Any]:
        """Check the arguments before anything runs."""
        reject_unknown(self.name, unknown, self.normalize_kwargs)
        if method not in METHODS:
            raise MemchunkError(f"svd method must be one of {METHODS}, got {method!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1):
            raise MemchunkError(f"svd k must be a positive int, got {k!r}")
        if method == "compressed" and k is None:
            raise MemchunkError("svd method='compressed' needs k= (the number of components)")
        if tsqr not in TSQR_MODES:
            raise MemchunkError(f"svd tsqr must be one of {TSQR_MODES}, got {tsqr!r}")
        if method == "compressed" and tsqr != "auto":
            raise MemchunkError(
                f"svd tsqr={tsqr!r} chooses how the exact SVD runs; method='compressed' does not "
                f"use tsqr: leave tsqr out, or pass method='exact'"
            )
        check_number(self.name, "n_power_iter", n_power_iter, integer=True)
        check_number(self.name, "n_oversamples", n_oversamples, integer=True)
        check_number(self.name, "seed", seed, integer=True)
        return {
            "sample_dims": (sample_dims,) if isinstance(sample_dims, str) else sample_dims,
            "method": method,
            "k": None if k is None else int(k),
            "n_power_iter": int(n_power_iter),
            "n_oversamples": int(n_oversamples),
            "seed": int(seed),
            "tsqr": tsqr,
        }

    #: LAPACK's types: float32, float64 and the complex ones (float16 is refused by bind).
    dtype_kinds = "fc"
    calibration_kwargs: ClassVar[dict[str, Any]] = {"sample_dims": ("time",), "method": "exact"}

    def bind(self, da: xr.DataArray, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Resolve ``sample_dims`` (names or CF axes) to dim names of ``da``; check ``k``.

        Raises
        ------
        MemchunkError
            float16 data, or ``k`` above what the matrix has: ``min(samples, features)``.
        """
        if da.dtype.kind in "fc" and da.dtype.itemsize < 4:
            raise MemchunkError(
                f"svd computes in float32 or float64, not {da.dtype}: convert the data first, "
                f"e.g. .astype('float32')"
            )
        samples, _ = _sides(da, kwargs["sample_dims"])
        rows, cols = _matrix_shape(da.sizes, samples)
        n = min(rows, cols)
        if kwargs["k"] is not None and kwargs["k"] > n:
            raise MemchunkError(
                f"svd k={kwargs['k']} asks for more components than the {n} a {rows}x{cols} "
                f"matrix has; pass k <= {n}"
            )
        return kwargs | {"sample_dims": samples}

    def alternatives(self, kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, str]]:
        """Exact (one pass, then two), then compressed when ``k`` is given (``method="auto"``)."""
        if kwargs["method"] == "compressed":
            return [("compressed SVD", kwargs, "")]
        exact = kwargs | {"method": "exact"}
        passes = ("one-pass", "two-pass") if kwargs["tsqr"] == "auto" else (kwargs["tsqr"],)
        options: list[tuple[str, dict[str, Any] | None, str]] = [
            (f"exact SVD ({mode} tsqr)", exact | {"tsqr": mode}, "") for mode in passes
        ]
        if kwargs["method"] == "exact":
            return options
        if kwargs["k"] is not None:
            label = f"compressed SVD (k={kwargs['k']})"
            options.append((label, kwargs | {"method": "compressed"}, ""))
        else:
            options.append(
                (
                    "compressed SVD",
                    None,
                    "no k was given for svd_compressed: pass k= (components to keep) so that "
                    "method='auto' can fall back to the compressed SVD, which chunks both dims",
                )
            )
        return options

    def dim_uses(self, da: xr.DataArray, sample_dims, method, **kwargs):
        """Exact: the shorter side whole, the longer one chunked along its first dim.

        The two-pass tsqr's blocks are at least ``n`` rows tall (``min_length``): every node
        of its tree then takes ``tpqrt``, whose held factors
        :func:`~xarray_memchunk.operators.svd.tsqr.held_bytes_per_block` counts. Compressed: the
        first dim of each side chunked, the rest whole.
        """
        samples, features = _sides(da, sample_dims)
        n_samples = math.prod(da.sizes[d] for d in samples)
        n_features = math.prod(da.sizes[d] for d in features)
        uses = {d: DimUse(DimRole.WHOLE) for d in (*samples, *features)}
        if method == "compressed":
            uses[samples[0]] = DimUse(DimRole.FREE)
            uses[features[0]] = DimUse(DimRole.FREE)
        else:
            long_side = samples if n_samples >= n_features else features
            shortest = 0
            if kwargs.get("tsqr") == "two-pass":  # blocks of at least n rows: tpqrt nodes
                rest = math.prod(da.sizes[d] for d in long_side[1:])
                shortest = -(-min(n_samples, n_features) // rest)
            uses[long_side[0]] = DimUse(DimRole.FREE, min_length=shortest)
        return uses

    def task_features(self, extents, uses, itemsize, sizes=None, **kwargs):
        """Block (or stacked-R) and square bytes of one task (see the module docstring)."""
        sizes = sizes or {d: int(np.max(v)) for d, v in extents.items()}
        samples, features = _split_names(extents, kwargs.get("sample_dims"))
        rows = np.prod([np.asarray(extents[d], float) for d in samples], axis=0)
        cols = np.prod([np.asarray(extents[d], float) for d in features], axis=0)
        total_rows, total_cols = _matrix_shape(sizes, kwargs.get("sample_dims"))
        if kwargs["method"] == "compressed":
            return {"block_bytes": rows * cols * itemsize}
        if kwargs.get("tsqr") == "two-pass":
            n = min(total_rows, total_cols)
            square = SQUARE_TASK_BLOCKS * n * n * itemsize
            return {"task_bytes": np.maximum(rows * cols * itemsize, square)}
        tall = total_rows >= total_cols
        chunk, n, total = (rows, cols, total_rows) if tall else (cols, rows, total_cols)
        blocks = np.ceil(total / chunk)
        stacked_rows = blocks * np.minimum(chunk, n)
        stacked_rows = np.where(chunk >= 2 * n, np.minimum(stacked_rows, chunk), stacked_rows)
        return {
            "block_bytes": np.maximum(chunk, stacked_rows) * n * itemsize,
            "square_bytes": n * n * itemsize,
        }

    def cost_terms(
        self,
        method: str,
        n_power_iter: int,
        tsqr: str = "one-pass",
        array_sizes: Mapping[str, int] | None = None,
        array_dtype: np.dtype | None = None,
        **kwargs: Any,
    ) -> CostTerms:
        """Exact, one pass: one task per block, calibration ``svd``, tsqr's Q factors held.

        Exact, two passes: each block read and factored twice, :data:`TWO_PASS_TASKS` tasks per
        block, :func:`~xarray_memchunk.operators.svd.tsqr.held_bytes_per_block` of the tree's
        factors held per block (with ``array_sizes`` and ``array_dtype``; a dense tree on the
        GPU, ``array_device="gpu"``), calibration ``svd-two-pass``.

        Compressed: the sketch, two passes per power iteration and the projection
        (``2 n_power_iter + 2``); ``6 + 5 n_power_iter`` tasks per block, counted in Dask's
        optimized graph of 4x4 to 8x8 blocks with :data:`COMPRESSED_ITERATOR` (6.2, 10.7 and
        16.2 per block for 0, 1 and 2 power iterations; ``tests/test_svd.py`` checks it);
        calibration ``svd-compressed``.
        """
        if method == "compressed":
            return CostTerms("svd-compressed", 2 * n_power_iter + 2, 6.0 + 5.0 * n_power_iter)
        if tsqr != "two-pass":
            return CostTerms("svd", held_share=TSQR_HELD_SHARE)
        held = 0.0
        if array_sizes is not None and array_dtype is not None:
            n = min(_matrix_shape(array_sizes, kwargs.get("sample_dims")))
            dense = kwargs.get("array_device") == "gpu"
            held = held_bytes_per_block(n, np.dtype(array_dtype), dense)
        return CostTerms("svd-two-pass", 2, TWO_PASS_TASKS, held_per_chunk=held)

    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """Exact: LAPACK QR/SVD in float64, a copy, Q and workspace ~9x a float32 block.

        Compressed: the block and products with thin matrices, ~1.1x a block (3x here).
        """
        if kwargs["method"] == "compressed":
            coefficients = {"block_bytes": 3.0}
        elif kwargs.get("tsqr") == "two-pass":  # the block, its float64 copy, Q times M: 6 x
            coefficients = {"task_bytes": 6.0}
        else:
            coefficients = {"block_bytes": 9.0, "square_bytes": 12.0}
        return LinearMemoryModel(coefficients, intercept=16 * 2**20)

    def calibration_shapes(self, method: str, **kwargs: Any) -> list[dict[str, int]]:
        """Task shapes to profile.

        Exact: tall single blocks, 0.2 to 40 MB; the two-pass tsqr also square ones (its SVD
        is their largest task). Compressed: blocks of 4 to 160 MB (float32).
        """
        if kwargs.get("tsqr") == "two-pass":
            sizes = [(1000, 1000), (2000, 1500), (2500, 2000)]
            return [{"time": t, "space": s} for t, s in sizes] + self.calibration_shapes("exact")
        if method == "compressed":
            sizes = [
                (1000, 1000),
                (2000, 3000),
                (4000, 2000),
                (3000, 6000),
                (6000, 4000),
                (5000, 8000),
                (8000, 5000),
                (10000, 4000),
            ]
        else:
            sizes = [
                (500, 100),
                (2000, 100),
                (1000, 400),
                (5000, 300),
                (4000, 800),
                (20000, 200),
                (10000, 1000),
                (8000, 1200),
            ]
        return [{"time": t, "space": s} for t, s in sizes]

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.Dataset:
        """Stack, decompose and unstack: a Dataset of ``U``, ``S`` and ``V``.

        A dim that carries a MultiIndex (``ds.stack(space=("lat", "lon"))``) is decomposed
        without it, since ``stack`` cannot stack it again, and the result gets it back.
        """
        import dask.array

        samples, features = _sides(da, kwargs["sample_dims"])
        multi = _multi_indexes(da, (*samples, *features))
        da = da.drop_vars(list(multi))
        stacked = da.stack(sample=samples, feature=features).transpose("sample", "feature")
        data, k = stacked.data, kwargs.get("k")
        lazy = hasattr(data, "dask")
        xp = array_module(data._meta if lazy else data)
        if lazy:  # LAPACK fails on NaN ("SVD did not converge"): say so, in the block's task
            data = data.map_blocks(_require_finite, dtype=data.dtype, meta=data._meta)
        elif not bool(xp.all(xp.isfinite(data))):
            raise MemchunkError(_NOT_FINITE)
        if kwargs["method"] == "compressed":
            if not lazy:  # in-memory data: the same randomized algorithm, on one block
                data = dask.array.from_array(xp.asarray(data), chunks=data.shape)
            u, s, v = dask.array.linalg.svd_compressed(
                data,
                k,
                iterator=COMPRESSED_ITERATOR,
                n_power_iter=kwargs["n_power_iter"],
                n_oversamples=kwargs["n_oversamples"],
                seed=_random_state(kwargs["seed"], xp),
                compute=lazy and not _input_fits_in_workers(data),
            )
        elif not lazy:
            u, s, v = xp.linalg.svd(xp.asarray(data), full_matrices=False)
        elif kwargs.get("tsqr") == "two-pass":
            u, s, v = _two_pass(data)
        else:
            u, s, v = dask.array.linalg.svd(data)
        if k is not None:
            u, s, v = u[:, :k], s[:k], v[:k, :]
        modes = np.arange(s.shape[0])
        result = xr.Dataset(
            {
                "U": (("sample", "mode"), u),
                "S": ("mode", s),
                "V": (("mode", "feature"), v),
            },
            coords={"sample": stacked["sample"], "feature": stacked["feature"], "mode": modes},
        )
        result = result.unstack("sample").unstack("feature")
        result["U"] = result["U"].transpose(*samples, "mode")
        result["V"] = result["V"].transpose("mode", *features)
        result["S"].attrs["long_name"] = "singular values"
        result["V"].attrs["long_name"] = "right singular vectors (EOF patterns)"
        result["U"].attrs["long_name"] = "left singular vectors (principal component series)"
        return result.drop_vars(_multi_dims(multi)).assign_coords(multi)

    def compute_dataset(self, ds, uses, **kwargs):
        """One variable only: the SVD of a Dataset's single planned variable."""
        if len(uses) != 1:
            raise MemchunkError(
                f"svd decomposes one variable; the Dataset has {len(uses)} ({', '.join(uses)}): "
                f"select one, e.g. ds['{next(iter(uses))}']"
            )
        (name,) = uses
        return self.compute(ds[name], uses[name], **kwargs)


def _multi_indexes(da: xr.DataArray, dims: Sequence[str]) -> xr.Coordinates:
    """The coordinates of ``da``'s pandas MultiIndexes along ``dims``, levels included."""
    names = [
        name
        for name, index in da.xindexes.items()
        if isinstance(index, PandasMultiIndex) and index.dim in dims
    ]
    return xr.Coordinates(
        {name: da.coords[name].variable for name in names},
        indexes={name: da.xindexes[name] for name in names},
    )


def _multi_dims(multi: xr.Coordinates) -> list[str]:
    """The dims the MultiIndexes of ``multi`` index (each got a range index from ``stack``)."""
    return sorted({str(d) for d in multi.dims})


_NOT_FINITE = (
    "svd needs finite values and the data has NaN or infinite values: fill or drop them "
    "first, e.g. .fillna(0) or .dropna(dim)"
)


#: Elements checked at once by :func:`_require_finite`: its boolean temporary stays at 4 MB
#: instead of a quarter of a float32 block (measured: a 1.6 GB block peaked at 2.0 GB).
FINITE_CHECK_ELEMENTS = 4 * 2**20


def _require_finite(block: np.ndarray) -> np.ndarray:
    """``block`` itself, or a clear error when it holds NaN or infinite values."""
    xp = array_module(block)
    for index in slabs(block.shape, block.ndim, FINITE_CHECK_ELEMENTS):  # views: no copy
        if not bool(xp.isfinite(block[index]).all()):
            raise MemchunkError(_NOT_FINITE)
    return block


def _two_pass(data: Any) -> tuple[Any, Any, Any]:
    """:func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd` of a tall or wide Dask array."""
    if data.shape[0] >= data.shape[1]:
        return two_pass_svd(data)
    # A^T = U' S V'^H  =>  A = (V'^H)^T S (U')^T
    u_t, s, vh_t = two_pass_svd(data.T)
    return vh_t.T, s, u_t.T


def _random_state(seed: int, xp: Any) -> Any:
    """The ``seed`` that ``svd_compressed`` takes for data of array module ``xp``.

    CuPy data gets a CuPy random state, so the sketch is made on the device; NumPy data the
    seed itself (Dask's NumPy generator).
    """
    if xp is np:
        return seed
    import dask.array

    return dask.array.random.RandomState(seed, RandomState=xp.random.RandomState)


def _split_names(extents, sample_dims) -> tuple[list[str], list[str]]:
    samples = [d for d in extents if sample_dims and d in sample_dims]
    features = [d for d in extents if d not in samples]
    return samples, features


def _matrix_shape(sizes: Mapping[str, int], sample_dims) -> tuple[int, int]:
    """``(rows, columns)`` of the stacked matrix: the sample dims' sizes, then every other dim's."""
    samples, features = _split_names(sizes, sample_dims)
    return math.prod(sizes[d] for d in samples), math.prod(sizes[d] for d in features)


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


def _input_fits_in_workers(data) -> bool:
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

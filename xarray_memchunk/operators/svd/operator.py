"""SVD and EOF/PCA: the operator, its arguments and the choice of algorithm.

The DataArray is stacked to 2-D: ``sample`` (the ``sample_dims``, e.g. time) by ``feature``
(every other dim, e.g. lat x lon). Three algorithms decompose it, one module each:

- :mod:`~xarray_memchunk.operators.svd.one_pass`: the exact SVD by Dask's tsqr
  (``dask.array.linalg.svd``), one side whole, every block's ``Q`` held until the end;
- :mod:`~xarray_memchunk.operators.svd.two_pass`: the exact SVD by memchunk's two-pass tsqr
  (:mod:`~xarray_memchunk.operators.svd.tsqr`), only ``n x n`` factors held, the input read
  twice;
- :mod:`~xarray_memchunk.operators.svd.compressed`: the compressed (randomized) SVD
  (``svd_compressed``), both sides chunked.

:data:`ALGORITHMS` names them by their ``tsqr=`` or ``method=`` value. ``method="auto"``
tries them in its order, those that ``method=`` and ``tsqr=`` select: the exact SVD first
(one pass, then two), then the compressed one. Once chosen (:func:`algorithm_for`), the
algorithm answers for the operator: the dims it chunks, its cost (task features, analytic
model, calibration key, passes, tasks and memory held; each calibrated apart: ``svd``,
``svd-two-pass`` and ``svd-compressed``), its calibration shapes and its computation.

EOF naming: ``V``'s modes are the spatial patterns (EOFs), ``U`` the principal components
(time series), ``S`` the singular values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr
from xarray.indexes import PandasMultiIndex

from ...errors import DimensionError, MemchunkError
from ...planning.problem import DimRole
from ..arguments import check_number, reject_unknown
from ..arrays import array_module
from ..base import Cost, DimUse, Operator
from ..dims import resolve_dims
from ..slabs import slabs
from .algorithm import Alternative, SVDAlgorithm, matrix_shape
from .compressed import CompressedSVD
from .one_pass import OnePassTsqr
from .two_pass import TwoPassTsqr

__all__ = ["ALGORITHMS", "SVD", "algorithm_for", "selected"]

#: ``method=``: the exact SVD, the compressed one, or the first of them whose plan fits.
METHODS = ("auto", "exact", "compressed")
#: How the exact SVD runs tsqr: Dask's (one pass, every block's Q held) or
#: :func:`~xarray_memchunk.operators.svd.tsqr.two_pass_svd` (two passes, only n x n factors held).
TSQR_MODES = ("auto", "one-pass", "two-pass")
#: The algorithms by the ``tsqr=`` (exact) or ``method=`` (compressed) value that names them, in
#: the order ``method="auto"`` tries them.
ALGORITHMS: dict[str, SVDAlgorithm] = {
    algorithm.name: algorithm for algorithm in (OnePassTsqr(), TwoPassTsqr(), CompressedSVD())
}


def algorithm_for(kwargs: Mapping[str, Any]) -> SVDAlgorithm:
    """The algorithm that the operator's arguments ``kwargs`` run.

    ``method="compressed"`` names the compressed SVD; otherwise ``tsqr=`` names the exact one,
    Dask's one-pass tsqr when it does not (``tsqr="auto"`` or left out, as calibration and the
    cost of ``method="auto"`` take it).
    """
    named = ALGORITHMS.get(kwargs.get("method")) or ALGORITHMS.get(kwargs.get("tsqr"))
    return named or ALGORITHMS[OnePassTsqr.name]


def selected(method: str, tsqr: str) -> list[SVDAlgorithm]:
    """The algorithms that ``method=`` and ``tsqr=`` let the operator try, in order."""
    return [algorithm for algorithm in ALGORITHMS.values() if algorithm.selected(method, tsqr)]


def _sides(
    da: xr.DataArray, sample_dims: Sequence[str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The sample dims (names or CF axes resolved) and the feature dims of ``da``."""
    if sample_dims is None:
        raise DimensionError(
            f"svd needs sample_dims=, e.g. sample_dims=('time',); dims are {tuple(da.dims)}"
        )
    samples = resolve_dims(da, sample_dims)
    features = tuple(str(d) for d in da.dims if d not in samples)
    if not features:
        raise DimensionError(f"svd needs at least one feature dim besides {samples}")
    return samples, features


def _arguments(
    sample_dims: str | Sequence[str] | None = None,
    method: str = "auto",
    k: int | None = None,
    n_power_iter: int = 2,
    n_oversamples: int = 10,
    seed: int = 0,
    tsqr: str = "auto",
    **unknown: Any,
) -> dict[str, Any]:
    """SVD's arguments checked, with their defaults.

    Raises
    ------
    MemchunkError
        Naming the unknown or invalid argument.
    """
    reject_unknown(SVD.name, unknown, _arguments)
    if method not in METHODS:
        raise MemchunkError(f"svd method must be one of {METHODS}, got {method!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1):
        raise MemchunkError(f"svd k must be a positive int, got {k!r}")
    if k is None and all(a.needs_k for a in selected(method, "auto")):  # "compressed"
        raise MemchunkError(f"svd method={method!r} needs k= (the number of components)")
    if tsqr not in TSQR_MODES:
        raise MemchunkError(f"svd tsqr must be one of {TSQR_MODES}, got {tsqr!r}")
    if not selected(method, tsqr):  # method="compressed" with tsqr=
        raise MemchunkError(
            f"svd tsqr={tsqr!r} chooses how the exact SVD runs; method={method!r} does not "
            f"use tsqr: leave tsqr out, or pass method='exact'"
        )
    check_number(SVD.name, "n_power_iter", n_power_iter, integer=True)
    check_number(SVD.name, "n_oversamples", n_oversamples, integer=True)
    check_number(SVD.name, "seed", seed, integer=True)
    return {
        "sample_dims": (sample_dims,) if isinstance(sample_dims, str) else sample_dims,
        "method": method,
        "k": None if k is None else int(k),
        "n_power_iter": int(n_power_iter),
        "n_oversamples": int(n_oversamples),
        "seed": int(seed),
        "tsqr": tsqr,
    }


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
    #: LAPACK's types: float32, float64 and the complex ones (float16 is refused by
    #: :meth:`check_arguments`).
    dtype_kinds = "fc"
    #: tsqr and the randomized SVD run on NumPy (LAPACK) and CuPy (cuSOLVER, cuBLAS) blocks.
    devices = ("cpu", "gpu")
    #: Each algorithm is calibrated apart: ``svd``, ``svd-two-pass``, ``svd-compressed``.
    shipped_calibrations = ({}, {"tsqr": "two-pass"}, {"method": "compressed", "k": 10})

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs; then resolve ``sample_dims`` and check ``k``.

        With ``da``, ``sample_dims`` (names or CF axes) become dim names of ``da``.

        Raises
        ------
        MemchunkError
            Unknown or invalid arguments. For ``da``: float16 data, or ``k`` above what the
            matrix has: ``min(samples, features)``.
        DimensionError
            For ``da``: without ``sample_dims``, or when they leave no feature dim.
        """
        if da is None:
            return _arguments(**kwargs)
        if da.dtype.kind in "fc" and da.dtype.itemsize < 4:
            raise MemchunkError(
                f"svd computes in float32 or float64, not {da.dtype}: convert the data first, "
                f"e.g. .astype('float32')"
            )
        samples, _ = _sides(da, kwargs["sample_dims"])
        rows, cols = matrix_shape(da.sizes, samples)
        n = min(rows, cols)
        if n == 0:
            empty = next(str(d) for d, size in da.sizes.items() if size == 0)
            raise DimensionError(
                f"dim {empty!r} has length 0: there is nothing to compute; select a non-empty "
                f"range first"
            )
        if kwargs["k"] is not None and kwargs["k"] > n:
            raise MemchunkError(
                f"svd k={kwargs['k']} asks for more components than the {n} a {rows}x{cols} "
                f"matrix has; pass k <= {n}"
            )
        return dict(kwargs) | {"sample_dims": samples}

    def alternatives(self, kwargs: dict[str, Any]) -> list[Alternative]:
        """Exact (one pass, then two), then compressed when ``k`` is given (``method="auto"``).

        Only the algorithms that ``method=`` and ``tsqr=`` select (:func:`selected`).
        """
        return [a.alternative(kwargs) for a in selected(kwargs["method"], kwargs["tsqr"])]

    def dims(
        self, da: xr.DataArray, sample_dims: Sequence[str] | None, method: str, **kwargs: Any
    ) -> dict[str, DimUse]:
        """Every dim whole but those the chosen algorithm chunks.

        Exact: the longer side's first dim; the two-pass tsqr's blocks are at least ``n`` rows
        tall (``min_length``). Compressed: the first dim of each side.
        """
        samples, features = _sides(da, sample_dims)
        uses = {d: DimUse(DimRole.WHOLE) for d in (*samples, *features)}
        algorithm = algorithm_for(kwargs | {"method": method})
        return uses | algorithm.chunked_dims(da.sizes, samples, features)

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """The chosen algorithm's cost (:meth:`SVDAlgorithm.cost`): each is calibrated apart."""
        return algorithm_for(kwargs).cost(da, kwargs)

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, int]]]:
        """``sample_dims=("time",)``, ``method="exact"``; the algorithm's task shapes to profile.

        Shapes are ``time`` by ``space``.
        """
        kwargs = self.check_arguments({"sample_dims": ("time",), "method": "exact"} | kwargs)
        return kwargs, algorithm_for(kwargs).calibration_shapes()

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.Dataset:
        """Stack, decompose and unstack: a Dataset of ``U``, ``S`` and ``V``.

        A dim that carries a MultiIndex (``ds.stack(space=("lat", "lon"))``) is decomposed
        without it, since ``stack`` cannot stack it again, and the result gets it back.
        """
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
        u, s, v = algorithm_for(kwargs).decompose(data, xp, kwargs)
        if k is not None:
            u, s, v = u[:, :k], s[:k], v[:k, :]
        result = _unstacked(u, s, v, stacked, samples, features)
        return result.drop_vars(_multi_dims(multi)).assign_coords(multi)

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """One variable only: the SVD of a Dataset's single planned variable."""
        if len(uses) != 1:
            raise MemchunkError(
                f"svd decomposes one variable; the Dataset has {len(uses)} ({', '.join(uses)}): "
                f"select one, e.g. ds['{next(iter(uses))}']"
            )
        (name,) = uses
        return self.compute(ds[name], uses[name], **kwargs)


def _unstacked(
    u: Any,
    s: Any,
    v: Any,
    stacked: xr.DataArray,
    samples: Sequence[str],
    features: Sequence[str],
) -> xr.Dataset:
    """``U``, ``S`` and ``V`` of the stacked matrix, on the dims of the DataArray."""
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
    return result


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

"""Reductions over whole dims, NumPy calls per planned chunk: median and quantile.

xarray's own ``median`` (``dask.array.nanmedian``) rechunks the kept dims to ``"auto"``,
merging the planned chunks into ~128 MiB ones, and its ``quantile`` puts ``q`` in the graph as a
Dask array of its own, which keeps the task that reads or produces a chunk apart from the task
that takes its quantiles (a worker can then read the next chunk first). Here both run the NumPy
function on each block (``xarray.apply_ufunc`` and ``map_blocks``): the chunks stay as planned,
reading a chunk fuses into the task that reduces it, and no block is copied before its call.
Results equal xarray's: values, dims, coordinates, dtype, and attributes (:func:`keeps_attrs`
asks xarray itself).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..errors import MemchunkError
from .arrays import array_module, to_numpy
from .order_statistics import contiguous_rows, has_nan, median_of_rows, quantiles_of_rows
from .slabs import slabs

__all__ = ["QUANTILE_METHODS", "check_quantile_args", "keeps_attrs", "median", "quantile"]

#: ``method=`` values numpy's (and so xarray's) quantile accepts.
QUANTILE_METHODS = (
    "inverted_cdf",
    "averaged_inverted_cdf",
    "closest_observation",
    "interpolated_inverted_cdf",
    "hazen",
    "weibull",
    "linear",
    "median_unbiased",
    "normal_unbiased",
    "lower",
    "higher",
    "midpoint",
    "nearest",
)


def keeps_attrs(name: str, keep_attrs: bool | None, *, dataset: bool = False) -> bool:
    """Whether xarray's own ``name`` reduction keeps attributes, given ``keep_attrs``.

    Asked of xarray itself, on a two-element DataArray (or Dataset, for a Dataset's own
    attributes): results follow the installed xarray's defaults, which changed over versions
    and differ between its methods (its quantile keeps them under ``keep_attrs=False``), and
    ``xr.set_options(keep_attrs=...)``.
    """
    probe = xr.DataArray([1.0, 2.0], dims="probe", attrs={"probe": 1})
    if dataset:
        probe = xr.Dataset({"probe": probe}, attrs={"probe": 1})
    args = (0.5,) if name == "quantile" else ()
    return bool(getattr(probe, name)(*args, dim="probe", keep_attrs=keep_attrs).attrs)


def median(
    da: xr.DataArray,
    dims: list[str],
    *,
    skipna: bool | None = None,
    keep_attrs: bool | None = None,
    **kwargs: Any,
) -> xr.DataArray:
    """``da.median(dims)``, the dims whole in each chunk, as NumPy calls per chunk."""
    use_nan = skipna or (skipna is None and da.dtype.kind in "fc")
    axes = tuple(range(-len(dims), 0))
    func = np.nanmedian if use_nan else np.median
    out_dtype = func(np.zeros((1,) * max(1, len(dims)), dtype=da.dtype)).dtype
    kernel = (
        functools.partial(_medians, axis=axes, dtype=out_dtype)
        if use_nan
        else functools.partial(np.median, axis=axes)
    )
    result = xr.apply_ufunc(
        _per_block(kernel, len(dims), out_dtype, "median"),
        da,
        input_core_dims=[dims],
        dask="allowed",
        keep_attrs=True,  # the coordinates' attributes, as xarray keeps them
    )
    result.attrs = dict(da.attrs) if keeps_attrs("median", keep_attrs) else {}
    return result


def quantile(
    da: xr.DataArray,
    dims: list[str],
    *,
    q: Any,
    method: str = "linear",
    skipna: bool | None = None,
    keep_attrs: bool | None = None,
    **kwargs: Any,
) -> xr.DataArray:
    """``da.quantile(q, dims)``, the dims whole in each chunk, as one NumPy call per chunk."""
    use_nan = skipna or (skipna is None and da.dtype.kind in "fc")
    func = np.nanquantile if use_nan else np.quantile
    qs = np.atleast_1d(np.asarray(q, dtype=float))
    axes = tuple(range(-len(dims), 0))
    sample = func(np.zeros((1,) * max(1, len(dims)), dtype=da.dtype), qs, method=method)
    kernel = functools.partial(
        _quantiles_last, func=func, q=qs, axis=axes, method=method, dtype=sample.dtype
    )
    single = np.ndim(q) == 0  # its quantile axis dropped in the task, as xarray drops it
    result = xr.apply_ufunc(
        _per_block(
            functools.partial(_first_quantile, kernel=kernel) if single else kernel,
            len(dims),
            sample.dtype,
            "quantile",
            new_length=None if single else len(qs),
        ),
        da,
        input_core_dims=[dims],
        output_core_dims=[[] if single else ["quantile"]],
        dask="allowed",
        keep_attrs=True,  # the coordinates' attributes, as xarray keeps them
    )
    # xarray's quantile keeps no coordinate of no dim (a scalar height, a selected time)
    result = result.drop_vars([n for n, c in result.coords.items() if c.ndim == 0])
    if single:
        result = result.assign_coords(quantile=float(qs[0]))
    else:
        result = result.transpose("quantile", ...).assign_coords(quantile=qs)
    result.attrs = dict(da.attrs) if keeps_attrs("quantile", keep_attrs) else {}
    return result


def _first_quantile(block: Any, kernel: Callable[[Any], Any]) -> Any:
    """``kernel``'s quantiles of ``block`` (the quantiles last), the first only, that axis gone."""
    return kernel(block)[..., 0]


def _per_block(
    kernel: Callable[[Any], Any],
    reduced: int,
    dtype: np.dtype,
    name: str,
    new_length: int | None = None,
) -> Callable[[Any], Any]:
    """``kernel`` on each block of an array whose last ``reduced`` axes it reduces.

    The block is handed on as it is (a view, the reduced axes last), with those axes whole in
    it (rechunked where a chunk cuts them). xarray's ``dask="parallelized"`` (Dask's
    ``apply_gufunc``), like ``map_blocks(..., drop_axis=...)``, concatenates each block along
    the axes it drops, a copy even where they are one chunk: of a 288 x 120 x 2920 float32
    median task, the copy took 1.1 s and the median 0.8 s; the median of the view takes
    1.35 s. So the axes are not dropped in the blocks: each result keeps them at length 1
    (``new_length``: the kernel's new last axis, the quantiles, takes the first of them), and
    they are dropped from the results after, by a second layer.

    Both layers are named ``name`` (``"median"``, ``"quantile"``) and a token. Dask fuses the
    second into the first at compute time and names the fused task after the names of the
    layers in it: with one name for both, the fused task is the result's own block, with no
    task after it. Named otherwise, a task that names the fused one's result (an ``Alias``)
    follows each block: the scheduler sends it to the worker where the block ended, and there
    it waits behind the worker's next task, already started, so that a worker of 1 thread is
    sent its next tasks two at a time at distributed's default ``worker-saturation`` (the
    staged median's 10 reductions, computed as they are, split 6/4 in 4 of 5 runs:
    ``benchmarks/queue_tail.py``'s ``median gathered``). That holds where the blocks come
    from memchunk's own reads (a file's, a staged store's); where another layer's task joins
    the fused chain (a rechunk of the input, xarray's transpose of several reduced dims), the
    ``Alias`` remains.
    """

    def run(data: Any) -> Any:
        if not hasattr(data, "dask"):  # NumPy or CuPy: one call
            return kernel(data)
        kept = data.ndim - reduced
        data = data.rechunk(dict.fromkeys(range(kept, data.ndim), -1))
        new = (new_length,) if new_length is not None else ()
        ones = reduced - len(new)
        result = data.map_blocks(
            functools.partial(_with_length_one_axes, kernel=kernel, ones=ones),
            chunks=(*data.chunks[:kept], *((n,) for n in new), *((1,),) * ones),
            dtype=dtype,
            meta=array_module(data._meta).empty((0,) * data.ndim, dtype=dtype),
            name=f"{name}-{tokenize(data, kernel, ones, new_length)}",
        )
        if not ones:
            return result
        return result.map_blocks(
            _without_last_axes,
            ones,
            drop_axis=tuple(range(result.ndim - ones, result.ndim)),
            dtype=dtype,
            meta=array_module(data._meta).empty((0,) * (result.ndim - ones), dtype=dtype),
            name=f"{name}-{tokenize(result.name)}",
        )

    return run


def _without_last_axes(block: Any, ones: int) -> Any:
    """``block`` without its last ``ones`` axes, each of length 1 (a view)."""
    return block[(..., *(0,) * ones)]


def _with_length_one_axes(block: Any, kernel: Callable[[Any], Any], ones: int) -> Any:
    """``kernel(block)`` with ``ones`` axes of length 1 added last."""
    result = kernel(block)
    return result.reshape(result.shape + (1,) * ones)


#: Elements per slab in :func:`_medians` and :func:`_quantiles_last`: each slab's copy stays
#: at 8 MB (float32).
SLAB_ELEMENTS = 2 * 2**20


def _medians(block: np.ndarray, axis: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.nanmedian(block, axis)``, slab by slab along the block's first (kept) axis.

    A NumPy slab is copied into contiguous rows (:func:`.order_statistics.contiguous_rows`):
    without NaN it takes :func:`.order_statistics.median_of_rows`, NumPy's median by
    single-order partitions (a 288 x 72 x 2920 float32 block, time strided: 0.20 s against
    0.90 s for ``np.median`` slab by slab); with NaN, ``np.nanmedian`` (a Python call per
    series). numbagg 0.9.6's ``nanmedian`` took 0.39 s on one thread for 288 x 45 x 1460, where
    ``np.median`` took 0.20 s. A slab's copy (8 MB) and NaN check are all it adds to memory.
    CuPy blocks take CuPy's own functions.
    """
    xp = array_module(block)
    if block.ndim == len(axis) or block.shape[0] == 0:
        return xp.asarray(xp.nanmedian(block, axis=axis), dtype=dtype)
    kept = block.ndim - len(axis)
    out = xp.empty(block.shape[:kept], dtype)
    buffer = None  # each slab's rows, copied into one array
    for index in slabs(block.shape, kept, SLAB_ELEMENTS):
        slab = block[index]  # a view: no copy of the block
        series = slab.shape[slab.ndim - len(axis) :]  # an index may drop a kept axis
        if xp is np and math.prod(series) > 0:
            if buffer is None:
                buffer = np.empty(slab.size, slab.dtype)
            rows = contiguous_rows(slab, len(axis), buffer)
            if has_nan(rows):  # the copy is nanmedian's own to reorder
                values = np.nanmedian(rows, axis=1, overwrite_input=True)
            else:
                values = median_of_rows(rows)
            out[index] = values.reshape(slab.shape[: slab.ndim - len(axis)])
        else:
            out[index] = (xp.nanmedian if xp.isnan(slab).any() else xp.median)(slab, axis=axis)
    return out


def _quantiles_last(block: np.ndarray, func, q, axis, method, dtype) -> np.ndarray:
    """NumPy's quantiles of ``block`` over ``axis`` as ``dtype``, the quantile axis moved last.

    The block goes in slabs along its first (kept) axis. A NumPy slab is copied into
    contiguous rows (:func:`.order_statistics.contiguous_rows`); without NaN it takes
    :func:`.order_statistics.quantiles_of_rows`, NumPy's quantiles by single-order partitions
    (a 288 x 72 x 2920 float32 block, time strided, q=0.9: 0.17 s against 0.52 s for
    ``np.quantile`` on contiguous slabs), or ``np.quantile`` for a method without
    interpolation. ``np.nanquantile`` over an axis runs a Python call per series
    (``apply_along_axis``), so only slabs with NaN take it (numbagg 0.9.6's ``nanquantile``
    took 0.31 s on one thread where ``np.quantile`` took 0.20 s, on 288 x 45 x 1460 float32).
    A slab's copy and NaN check are all it adds to memory. A slab with NaN is computed in
    ``dtype``: ``np.nanquantile`` drops to float32 arithmetic for a float32 block that holds
    an all-NaN series, which would make values depend on the chunking.

    A CuPy block runs ``cupy.quantile`` on the device; CuPy has no ``nanquantile``, so a slab
    with NaN is copied to the host for NumPy's and its values copied back.
    """
    xp = array_module(block)
    q = xp.asarray(q)
    whole = block.ndim == len(axis) or block.shape[0] == 0 or 0 in block.shape[-len(axis) :]
    if whole or (xp is not np and func is not np.nanquantile):
        # one series (its value is NaN or exact either way), none, or no NaN handling
        if func is np.nanquantile and xp is not np:
            return _nanquantile_on_host(block, q, axis, method, dtype)
        values = (func if xp is np else xp.quantile)(block, q, axis=axis, method=method)
        return xp.moveaxis(values, 0, -1).astype(dtype, copy=False)
    kept = block.ndim - len(axis)
    out = xp.empty((*block.shape[:kept], len(q)), dtype)
    buffer = None  # each slab's rows, copied into one array
    for index in slabs(block.shape, kept, SLAB_ELEMENTS):
        slab = block[index]  # a view: no copy of the block
        if xp is np:
            if buffer is None:
                buffer = np.empty(slab.size, slab.dtype)
            out[index] = _quantiles_of_slab(slab, func, q, len(axis), method, dtype, buffer)
        elif not xp.isnan(slab).any():
            out[index] = xp.moveaxis(xp.quantile(slab, q, axis=axis, method=method), 0, -1)
        else:
            out[index] = _nanquantile_on_host(slab, q, axis, method, dtype)
    return out


def _quantiles_of_slab(slab, func, q, reduced, method, dtype, buffer=None) -> np.ndarray:
    """NumPy's quantiles of a NumPy ``slab`` over its last ``reduced`` axes, quantiles last.

    ``buffer``: where its rows are copied (:func:`.order_statistics.contiguous_rows`).
    """
    rows = contiguous_rows(slab, reduced, buffer)
    if has_nan(rows):
        if func is np.nanquantile:
            values = _nanquantile_on_host(rows, q, 1, method, dtype)
        else:
            values = np.moveaxis(np.quantile(rows, q, axis=1, method=method), 0, -1)
    else:
        values = quantiles_of_rows(rows, q, method)
        if values is None:
            values = np.moveaxis(np.quantile(rows, q, axis=1, method=method), 0, -1)
    return values.reshape(*slab.shape[: slab.ndim - reduced], len(q)).astype(dtype, copy=False)


def _nanquantile_on_host(block, q, axis, method, dtype):
    """``np.nanquantile`` in ``dtype``, quantile axis last, on ``block``'s device."""
    xp = array_module(block)
    values = np.nanquantile(to_numpy(block).astype(dtype), to_numpy(q), axis=axis, method=method)
    return xp.asarray(np.moveaxis(values, 0, -1))


def check_quantile_args(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``q`` and ``method`` checked: numbers within [0, 1], not empty, no NaN; a NumPy method.

    Raises
    ------
    MemchunkError
        Naming what was wrong.
    """
    if "q" not in kwargs:
        raise MemchunkError("'quantile' needs q=, e.g. q=0.9 or q=[0.1, 0.5, 0.9]")
    q = kwargs["q"]
    try:
        values = np.asarray(q, dtype=float)
    except (TypeError, ValueError) as exc:
        raise MemchunkError(f"quantile q must be a number or a list of numbers, got {q!r}") from exc
    if values.ndim > 1 or values.size == 0:
        raise MemchunkError(
            f"quantile q must be a number or a non-empty list of numbers, got {q!r}"
        )
    if not np.all(np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        raise MemchunkError(f"quantile q must be within [0, 1], got {q!r}")
    method = kwargs.get("method", "linear")
    if method not in QUANTILE_METHODS:
        raise MemchunkError(
            f"quantile method must be one of {', '.join(QUANTILE_METHODS)}; got {method!r}"
        )
    return dict(kwargs)

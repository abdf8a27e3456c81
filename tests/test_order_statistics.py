"""Medians and quantiles by single-order partitions equal NumPy's, value for value."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from xarray_memchunk.operators import order_statistics, whole_dims
from xarray_memchunk.operators.order_statistics import (
    contiguous_rows,
    median_of_rows,
    quantiles_of_rows,
)
from xarray_memchunk.operators.whole_dims import QUANTILE_METHODS, _medians, _quantiles_last

QS = [np.array([0.9]), np.array([0.0, 1.0]), np.array([0.5, 0.1, 0.99, 0.25])]


def _rows(kind: str, length: int, dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((7, length)).astype(dtype)
    if kind == "ties":
        rows = np.round(rows)
    elif kind == "inf":
        rows[rng.random(rows.shape) < 0.2] = np.inf
        rows[rng.random(rows.shape) < 0.2] = -np.inf
    return rows


@pytest.mark.parametrize("length", [1, 2, 3, 4, 65, 130])
@pytest.mark.parametrize("kind", ["normal", "ties", "inf"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_median_of_rows_equals_numpy(length, kind, dtype):
    rows = _rows(kind, length, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf in the mean, as in NumPy's
        expected = np.median(rows, axis=1)
        got = median_of_rows(rows.copy())
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("method", QUANTILE_METHODS)
@pytest.mark.parametrize("length", [1, 2, 5, 130])
@pytest.mark.parametrize("kind", ["normal", "ties", "inf"])
def test_quantiles_of_rows_equal_numpy(method, length, kind):
    rows = _rows(kind, length, "float32", seed=length)
    for q in QS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.moveaxis(np.quantile(rows, q, axis=1, method=method), 0, -1)
            got = quantiles_of_rows(rows.copy(), q, method)
        if got is None:  # a method NumPy answers without interpolating
            assert order_statistics._QuantileMethods[method]["fix_gamma"] is None
            continue
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_contiguous_rows_copies_a_strided_view_in_order():
    data = np.arange(300 * 4 * 5, dtype="float32").reshape(300, 4, 5)
    view = np.moveaxis(data, 0, -1)  # the reduced axis last and strided, longer than a tile
    rows = contiguous_rows(view, 1)
    assert rows.flags.c_contiguous and not np.shares_memory(rows, data)
    np.testing.assert_array_equal(rows, np.ascontiguousarray(view).reshape(20, 300))
    np.testing.assert_array_equal(contiguous_rows(view[..., None], 2), rows)


@pytest.mark.parametrize("slab", [3 * 6 * 150, 6 * 150, 150])  # kept rows; one kept row; a series
def test_block_kernels_on_strided_views_equal_numpy(slab, monkeypatch):
    monkeypatch.setattr(whole_dims, "SLAB_ELEMENTS", slab)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((150, 5, 6)).astype("float32")
    data[4, 1, 2] = np.nan  # a slab takes nanmedian, the others the partitions
    data[:, 3, 0] = np.nan  # an all-NaN series
    view = np.moveaxis(data, 0, -1)
    q = np.array([0.1, 0.9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(
            _medians(view, (-1,), np.dtype("float32")), np.nanmedian(view, axis=-1)
        )
        for func in (np.nanquantile, np.quantile):
            expected = np.moveaxis(func(view.astype("float64"), q, axis=-1), 0, -1)
            got = _quantiles_last(view, func, q, (-1,), "linear", np.dtype("float64"))
            np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[3, 0]).all() and not np.isnan(got[0, 0]).any()


def test_without_numpys_helpers_quantiles_take_numpys_function(monkeypatch):
    monkeypatch.setattr(order_statistics, "_QuantileMethods", None)
    view = np.moveaxis(np.random.default_rng(4).standard_normal((90, 3, 4)), 0, -1)
    q = np.array([0.9])
    assert quantiles_of_rows(contiguous_rows(view, 1), q, "linear") is None
    got = _quantiles_last(view, np.nanquantile, q, (-1,), "linear", np.dtype("float64"))
    np.testing.assert_array_equal(got, np.moveaxis(np.nanquantile(view, q, axis=-1), 0, -1))


def test_has_nan_finds_a_nan_among_infinities_and_nothing_else():
    from xarray_memchunk.operators.order_statistics import has_nan

    rows = np.array([[np.inf, -np.inf, 1.0], [0.0, -0.0, 2.0]], dtype="float32")
    assert not has_nan(rows)
    rows[1, 2] = np.nan
    assert has_nan(rows)
    assert not has_nan(np.arange(6).reshape(2, 3))
    assert not has_nan(np.empty((0, 3)))


def test_rows_copied_into_a_buffer_equal_a_fresh_copy():
    block = np.random.default_rng(3).standard_normal((300, 5, 7)).astype("float32")
    view = np.moveaxis(block, 0, -1)  # time strided
    buffer = np.full(view.size + 3, np.nan, "float32")
    rows = contiguous_rows(view, 1, buffer)
    np.testing.assert_array_equal(rows, contiguous_rows(view, 1))
    assert np.shares_memory(rows, buffer)
    assert not np.shares_memory(contiguous_rows(view, 1, buffer[:10]), buffer)  # too small

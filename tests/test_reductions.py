import cf_xarray  # noqa: F401  (the .cf accessor)
import dask
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate

TREE = ["sum", "mean", "std", "var", "min", "max"]


@pytest.fixture
def tas():
    ds = synthetic_climate(60, 20, 30, chunks={"time": 1})
    ds["tas"][5, 3, 4] = np.nan  # exercises skipna
    return ds


@pytest.mark.parametrize("op", [*TREE, "median"])
def test_reductions_equal_xarray(tas, op, threaded):
    expected = getattr(tas.tas.load(), op)("time")
    result = tas.tas.memchunk.apply(op, dim="time", memory_limit="2GB")
    assert isinstance(result, xr.DataArray)
    np.testing.assert_allclose(result.values, expected.values, rtol=2e-6)


def test_quantile_equals_xarray(tas, threaded):
    expected = tas.tas.load().quantile([0.1, 0.9], dim="time")
    result = tas.tas.memchunk.apply("quantile", q=[0.1, 0.9], dim="time", memory_limit="2GB")
    np.testing.assert_allclose(result.values, expected.values, rtol=1e-6)


@pytest.mark.parametrize("slab", [2 * 5 * 60, 2 * 60])  # 2 lat rows; 2 series of a lat row
@pytest.mark.parametrize("method", ["linear", "nearest", "hazen"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_quantile_in_slabs_with_and_without_nan_equals_xarray(method, dtype, slab, monkeypatch):
    from xarray_memchunk.operators import whole_dims

    monkeypatch.setattr(whole_dims, "SLAB_ELEMENTS", slab)
    data = synthetic_climate(60, 9, 5, dtype=dtype).tas
    data[7, 4, 2] = np.nan  # one slab takes nanquantile, the others quantile
    data[:, 8, 0] = np.nan  # an all-NaN series
    # numpy's nanquantile computes a float32 array holding an all-NaN series in float32:
    # memchunk computes every series as a NaN-free float32 series is (float64 for "linear")
    with dask.config.set(scheduler="synchronous"):
        result = data.chunk({"lat": 9}).memchunk.apply(
            "quantile", q=[0.25, 0.9], dim="time", method=method, memory_limit="2GB"
        )
        values = result.values
    clean = data.fillna(0).quantile([0.25, 0.9], dim="time", method=method)
    expected = data.astype("float64").quantile([0.25, 0.9], dim="time", method=method)
    assert result.dtype == clean.dtype
    np.testing.assert_array_equal(values, expected.values.astype(clean.dtype))


@pytest.mark.parametrize("slab", [2 * 5 * 60, 2 * 60])  # 2 lat rows; 2 series of a lat row
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_median_in_slabs_with_and_without_nan_equals_xarray(dtype, slab, monkeypatch):
    from xarray_memchunk.operators import whole_dims

    monkeypatch.setattr(whole_dims, "SLAB_ELEMENTS", slab)
    data = synthetic_climate(60, 9, 5, dtype=dtype).tas
    data[7, 4, 2] = np.nan  # one slab takes nanmedian, the others median
    data[:, 8, 0] = np.nan  # an all-NaN series
    with dask.config.set(scheduler="synchronous"), np.errstate(invalid="ignore"):
        result = data.chunk({"lat": 9}).memchunk.apply("median", dim="time", memory_limit="2GB")
        values = result.values
    with xr.set_options(use_numbagg=False):  # numbagg, where installed, gives float64
        expected = data.median("time")
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(values, expected.values)


def test_cf_axis_names_the_time_dim(tas, threaded):
    plan = tas.memchunk.plan("median", dim="T", memory_limit="2GB")
    assert plan.whole_dims == ("time",)
    assert plan.dask_chunks["time"] == (60,)
    result = tas.memchunk.apply("mean", dim="T", memory_limit="2GB")
    assert isinstance(result, xr.Dataset)
    assert set(result.tas.dims) == {"lat", "lon"}
    # the standard name works too
    assert tas.memchunk.plan("median", dim="time", memory_limit="2GB").whole_dims == ("time",)


def test_cf_axis_t_names_a_decoded_time_without_attributes(tas, threaded):
    """A netCDF file's time, decoded to datetimes, keeps no units and here no axis: a new
    user's ``--dim T`` found "no dim 'T' ... CF axes found: X, Y". cf-xarray guesses it."""
    dates = xr.date_range("2000-01-01", periods=tas.sizes["time"], freq="D")
    bare = tas.assign_coords(time=dates)  # datetimes, as xarray decodes them: no attributes
    assert "T" not in bare.cf.axes and not bare.time.attrs
    assert bare.memchunk.plan("median", dim="T", memory_limit="2GB").whole_dims == ("time",)


def test_median_keeps_planned_chunks():
    tas = synthetic_climate(200, 90, 180, chunks={"time": 1}).tas
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=20 * 2**20, source="test"
    )
    plan = tas.memchunk.plan("median", dim="time", budget=budget)
    assert len(plan.dask_chunks["lat"]) * len(plan.dask_chunks["lon"]) > 1
    result = tas.memchunk.apply("median", dim="time", budget=budget)
    # xarray's own median would merge these into "auto" chunks
    assert result.chunks == (plan.dask_chunks["lat"], plan.dask_chunks["lon"])


def test_tree_reductions_may_chunk_the_reduced_dim(tas):
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=9 * 2**20, source="test"
    )
    big = synthetic_climate(400, 90, 180, chunks={"time": 1})
    plan = big.memchunk.plan("mean", dim="time", budget=budget)
    assert len(plan.dask_chunks["time"]) > 1
    assert plan.predicted_peak_bytes <= budget.per_task


def test_unknown_dim_is_a_dimension_error(tas):
    with pytest.raises(xm.DimensionError, match=r"no dim 'depth'.*dims"):
        tas.memchunk.plan("mean", dim="depth")


def test_unknown_operator_lists_names(tas):
    with pytest.raises(xm.UnknownOperatorError, match=r"known operators:.*gst3d.*median"):
        tas.memchunk.plan("medain")


def test_a_plain_function_is_told_to_be_decorated(tas):
    def smooth(block):
        return block

    with pytest.raises(xm.UnknownOperatorError, match=r"'smooth' is a plain function.*operator"):
        tas.memchunk.plan(smooth)


def test_quantile_needs_q(tas):
    with pytest.raises(xm.MemchunkError, match="needs q="):
        tas.memchunk.plan("quantile", dim="time")
    with pytest.raises(xm.MemchunkError, match=r"within \[0, 1\]"):
        tas.memchunk.plan("quantile", dim="time", q=1.5)


def test_unexpected_argument_is_rejected(tas):
    with pytest.raises(xm.MemchunkError, match="unexpected arguments"):
        tas.memchunk.plan("mean", dim="time", ddof=1)


@pytest.mark.parametrize("op", ["median", "quantile"])
def test_whole_dim_kernels_get_each_block_uncopied(op, monkeypatch, threaded):
    """Dask's apply_gufunc (and map_blocks with drop_axis) copied every block before the call."""
    from xarray_memchunk.operators import whole_dims

    name = "_medians" if op == "median" else "_quantiles_last"
    kernel, seen = getattr(whole_dims, name), []

    def watched(block, *args, **kwargs):
        seen.append(block.base is not None and not block.flags.owndata)
        return kernel(block, *args, **kwargs)

    monkeypatch.setattr(whole_dims, name, watched)
    values = synthetic_climate(50, 12, 16).tas.values
    tas = xr.DataArray(values, dims=("time", "lat", "lon"))  # NumPy: cut into views
    kwargs = {"q": [0.1, 0.9]} if op == "quantile" else {}
    result = tas.memchunk.apply(op, dim="time", chunks={"lat": 6, "lon": 8}, **kwargs)
    expected = getattr(tas, op)(*kwargs.values(), dim="time")
    np.testing.assert_allclose(result.values, expected.values, rtol=1e-6)
    assert result.dims == expected.dims
    assert len(seen) == 4 and all(seen)


@pytest.mark.parametrize(("op", "kwargs"), [("median", {}), ("quantile", {"q": 0.9})])
def test_a_whole_dim_reduction_s_blocks_are_its_tasks_with_nothing_after_them(op, kwargs, tmp_path):
    """Each block of the result was named by a task after the one that made it (a Dask
    ``Alias``): sent to the worker when the block ended, it waited there behind the worker's
    next task, so that single-thread workers were sent their tasks two at a time, and the
    staged median's 10 blocks, computed, split 6/4 in 4 of 5 runs."""
    from dask.core import flatten

    synthetic_climate(60, 12, 16).chunk({"time": 10}).to_zarr(tmp_path / "tas.zarr")
    tas = xr.open_zarr(tmp_path / "tas.zarr")["tas"]
    result = tas.memchunk.apply(op, dim="time", memory_limit="1GB", **kwargs)
    expected = getattr(tas, op)(*kwargs.values(), dim="time")
    xr.testing.assert_allclose(result.compute(), expected.compute())
    array = result.data
    keys = list(flatten(array.__dask_keys__()))
    graph = dict(array.__dask_optimize__(array.__dask_graph__(), keys))
    assert not [k for k, task in graph.items() if type(task).__name__ == "Alias"]
    assert all(graph[k].key == k for k in keys)  # each block is the task that makes it


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("keep_attrs", [None, False])
def test_median_and_quantile_keep_the_coordinates_xarray_keeps(chunked, keep_attrs):
    """A review found quantile dropping the coordinates' attributes (median too, with
    keep_attrs=False), and keeping a scalar coordinate that xarray's quantile drops."""
    tas = synthetic_climate(24, 6, 8).tas.assign_coords(height=2.0)
    tas = tas.chunk({"lat": 3}) if chunked else tas
    for op, kwargs in [("median", {}), ("quantile", {"q": 0.3}), ("quantile", {"q": [0.2, 0.8]})]:
        result = tas.memchunk.apply(op, dim="time", keep_attrs=keep_attrs, **kwargs)
        expected = getattr(tas, op)(*kwargs.values(), dim="time", keep_attrs=keep_attrs)
        assert sorted(result.coords) == sorted(expected.coords), (op, kwargs)
        for name in expected.coords:
            assert result[name].attrs == expected[name].attrs, (op, kwargs, name)
        assert result.attrs == expected.attrs, (op, kwargs)

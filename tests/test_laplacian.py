"""The built-in 2-D Laplacian: SciPy's ``laplace(mode="nearest")``, chunked, from Zarr too."""

import warnings

import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk._dask_compat import graph_layers, neighbour_gathering_layers
from xarray_memchunk.operators.laplacian import Laplacian, laplacian_on_axes
from xarray_memchunk.operators.registry import builtin_operators


def reference(values, axes):
    """``scipy.ndimage.laplace(values, mode="nearest")`` over ``axes`` only."""
    return sum(ndimage.correlate1d(values, [1, -2, 1], axis=a, mode="nearest") for a in axes)


def test_chunked_equals_scipy_and_the_unchunked_result(threaded):
    values = np.random.default_rng(0).standard_normal((300, 200))
    da = xr.DataArray(values, dims=("y", "x"), coords={"y": np.arange(300)}, attrs={"units": "K"})
    result = da.memchunk.apply("laplacian", chunks={"y": 70, "x": 45}, memory_limit="1GB")
    assert result.chunks == ((70, 70, 70, 70, 20), (45, 45, 45, 45, 20))
    assert result.dtype == da.dtype and result.dims == da.dims and result.attrs == {}
    np.testing.assert_allclose(result.values, ndimage.laplace(values, mode="nearest"), atol=1e-12)
    # every element sums the same terms in the same order, whatever the chunking
    np.testing.assert_array_equal(result.values, laplacian_on_axes(values, (0, 1)))
    xr.testing.assert_identical(result.y, da.y)


def test_cf_axes_name_the_dims_and_other_dims_are_free(threaded):
    values = np.random.default_rng(1).standard_normal((40, 30, 6)).astype("float32")
    da = xr.DataArray(
        values,
        dims=("lat", "lon", "time"),
        coords={"lat": ("lat", np.arange(40.0), {"axis": "Y"}), "lon": ("lon", np.arange(30.0))},
    )
    da.lon.attrs["axis"] = "X"
    plan = da.chunk({"time": 1}).memchunk.plan("laplacian", dims=("Y", "X"), memory_limit="1GB")
    assert plan.halo == {"lat": 1, "lon": 1}
    result = da.memchunk.apply("laplacian", dims=("Y", "X"), chunks={"lat": 15, "lon": 10})
    assert result.dtype == np.float32
    np.testing.assert_allclose(result.values, reference(values, (0, 1)), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A 600 x 500 float32 field in a Zarr store of 50 x 50 chunks, opened in 300 x 250."""
    path = tmp_path_factory.mktemp("laplacian") / "field.zarr"
    values = np.random.default_rng(2).standard_normal((600, 500), dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Zarr v3's consolidated metadata warning
        xr.Dataset({"f": (("y", "x"), values)}).to_zarr(path, encoding={"f": {"chunks": (50, 50)}})
        ds = xr.open_zarr(path, chunks={"y": 300, "x": 250})
    yield ds, values
    ds.close()


def test_zarr_input_reads_halos_from_the_file(stored, threaded):
    ds, values = stored
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=400_000, source="test"
    )
    plan = ds.memchunk.plan("laplacian", budget=budget)
    assert plan.fits and plan.halo == {"y": 1, "x": 1}
    assert "laplacian-cpu.json" in " ".join(plan.notes)  # the shipped calibration
    # the input's 300 x 250 chunks are too large for the budget: they are cut finer
    assert plan.n_chunks > 4 and max(plan.dask_chunks["y"]) < 300, plan.dask_chunks
    result = plan.apply()
    assert neighbour_gathering_layers(result, graph_layers(result)) == []
    assert any(str(n).startswith("memchunk-halo-read-") for n in graph_layers(result.f.data))
    np.testing.assert_allclose(
        result.f.values, ndimage.laplace(values, mode="nearest"), rtol=1e-5, atol=1e-5
    )


def test_plan_with_room_takes_whole_storage_chunks(stored):
    ds, _ = stored
    plan = ds.memchunk.plan("laplacian", memory_limit="4GB")
    assert plan.fits and plan.storage_aligned
    # within the budget, the plan takes whole 50 x 50 storage chunks
    assert all(c % 50 == 0 for d in "yx" for c in plan.dask_chunks[d][:-1])


def test_refusals_before_anything_runs():
    with pytest.raises(xm.DimensionError, match="needs two dims"):
        xr.DataArray(np.zeros(5), dims="x").memchunk.plan("laplacian")
    with pytest.raises(xm.MemchunkError, match="unexpected arguments"):
        xr.DataArray(np.zeros((5, 5)), dims=("y", "x")).memchunk.plan("laplacian", depth=2)
    with pytest.raises(xm.MemchunkError, match="two dims"):
        xr.DataArray(np.zeros((5, 5)), dims=("y", "x")).memchunk.plan("laplacian", dims="y")
    with pytest.raises(xm.MemchunkError, match="int64"):
        xr.DataArray(np.zeros((5, 5), "int64"), dims=("y", "x")).memchunk.plan("laplacian")


def test_found_as_a_built_in_without_being_listed():
    from calibrate_shipped import shipped  # benchmarks/, on pytest's pythonpath

    assert "laplacian" in [op.name for op in builtin_operators()]
    assert "laplacian" in [key for *_, key in shipped("cpu")]
    assert "laplacian" not in [key for *_, key in shipped("gpu")]  # NumPy blocks only
    with pytest.raises(xm.MemchunkError, match="built-in"):
        xm.register_operator(Laplacian(), overwrite=True)

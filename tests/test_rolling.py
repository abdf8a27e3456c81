"""Moving windows as a stencil along time: trailing (one-sided) and centred halos."""

import dask
import numpy as np
import pytest
import xarray as xr
from daily_data import daily

import xarray_memchunk  # noqa: F401  (the accessor)
from xarray_memchunk._dask_compat import graph_layers, neighbour_gathering_layers
from xarray_memchunk.errors import MemchunkError
from xarray_memchunk.operators.blockwise import BlockwiseOperator
from xarray_memchunk.operators.rolling import window_halo
from xarray_memchunk.planning.candidates import padded_extent
from xarray_memchunk.testing import run_watched

# The data are standard normal float32. A rolling sum runs along each task's block, so where a
# plan puts the block edges (a plan left to choose them is timed) moves the last bits of values
# near zero: compare relative to the data's scale (the CI run that failed differed by 2.1e-8).
FLOAT32 = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path / "calibrations"))
    # every argument set measures itself on its first plan: a short bound keeps the tests quick
    with dask.config.set({"memchunk.self-calibration-seconds": 2}):
        yield


@pytest.mark.parametrize(("window", "center"), [(30, False), (30, True), (7, True), (1, False)])
def test_equals_xarray_across_chunks(window, center, threaded):
    tas = daily(chunks={"time": 50})
    plan = tas.memchunk.plan(
        "rolling", dim="time", window=window, center=center, chunks={"time": 40}
    )
    assert len(plan.dask_chunks["time"]) > 1  # the window crosses chunk edges
    result = plan.apply()
    expected = tas.rolling(time=window, center=center).mean()
    np.testing.assert_allclose(result.values, expected.values, **FLOAT32, equal_nan=True)
    assert result.dims == tas.dims and result.name == "tas"
    np.testing.assert_array_equal(result.time.values, tas.time.values)


@pytest.mark.parametrize("reduction", ["sum", "std", "max", "median"])
def test_other_reductions_and_min_periods(reduction, threaded):
    tas = daily(days=200, chunks={"time": 20})
    tas.time.attrs["axis"] = "T"  # the dim named by its CF axis
    result = tas.memchunk.apply(
        "rolling", dim="T", window=10, reduction=reduction, min_periods=3, chunks={"time": 25}
    )
    rolled = tas.rolling(time=10, min_periods=3)
    np.testing.assert_allclose(
        result.values, getattr(rolled, reduction)().values, rtol=1e-5, atol=1e-5, equal_nan=True
    )


def test_window_halo_is_where_xarray_reads():
    assert window_halo(30, center=False) == (29, 0)
    assert window_halo(30, center=True) == (15, 14)
    assert window_halo(5, center=True) == (2, 2)
    # xarray's centred window of 4 at element 2 sums elements 0..3
    values = xr.DataArray(np.arange(10.0), dims="t").rolling(t=4, center=True).sum().values
    assert values[2] == 0 + 1 + 2 + 3


def test_one_sided_halo_is_planned_one_sided():
    tas = daily(days=3650, chunks={"time": 365})
    plan = tas.memchunk.plan("rolling", dim="time", window=30, chunks={"time": 365})
    assert plan.halo == {"time": (29, 0)}
    assert "29 before, 0 after" in plan.explain()
    # a middle task reads 29 steps before its chunk and none after
    assert int(padded_extent(365, 10, (29, 0))) == 365 + 29
    assert int(padded_extent(365, 2, (29, 0))) == 365 + 29
    assert int(padded_extent(365, 1, (29, 0))) == 365
    assert int(padded_extent(365, 3, (15, 14))) == 365 + 29


def test_time_is_cut_when_memory_binds():
    tas = daily(days=4000, lat=40, lon=60, chunks={"time": 100})
    plan = tas.memchunk.plan("rolling", dim="time", window=30, memory_limit="300MB")
    assert plan.fits
    assert len(plan.dask_chunks["time"]) > 1  # not whole: a stencil along time
    assert min(plan.dask_chunks["time"]) >= 29  # at least the halo (map_overlap's rule)


def test_zarr_input_reads_its_halo_from_the_file(tmp_path, threaded):
    path = tmp_path / "daily.zarr"
    daily(days=400).to_dataset().to_zarr(path)
    tas = xr.open_zarr(path)["tas"]
    result = tas.memchunk.apply("rolling", dim="time", window=30, chunks={"time": 50})
    assert neighbour_gathering_layers(result, graph_layers(result)) == []
    expected = tas.load().rolling(time=30).mean()
    np.testing.assert_allclose(result.values, expected.values, **FLOAT32, equal_nan=True)


def test_dataset_is_rolled_as_xarray_rolls_it(threaded):
    ds = daily(days=100, chunks={"time": 10}).to_dataset()
    ds["orography"] = xr.DataArray(np.ones((20, 30)), dims=("lat", "lon"))
    ds["count"] = (ds.tas > 0).astype("int32")
    result = ds.memchunk.apply("rolling", dim="time", window=5, chunks={"time": 20})
    expected = ds.rolling(time=5).mean()
    assert list(result.data_vars) == list(expected.data_vars) == ["tas", "orography", "count"]
    for name in expected.data_vars:  # integers rolled as float64, the map kept as it is
        assert result[name].dtype == expected[name].dtype
        np.testing.assert_allclose(result[name], expected[name], **FLOAT32, equal_nan=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": "time"}, "needs dim= and window="),
        ({"dim": "time", "window": 0}, "window must be at least 1"),
        ({"dim": "time", "window": 3, "reduction": "mode"}, "reduction must be one of"),
        ({"dim": "time", "window": 3, "min_periods": 5}, "must not exceed window"),
        ({"dim": "time", "window": 3, "center": "yes"}, "center must be True or False"),
        ({"dim": "time", "window": 3, "stride": 2}, "unexpected arguments ['stride']"),
        ({"dim": "time", "window": 3, "center": 2}, "center must be True or False"),
        # a new user's window=2000 on 730 days: refused after 10 s of measuring, as beyond
        # the measured range
        ({"dim": "time", "window": 101}, "no window holds 101 values"),
        ({"dim": "time", "window": 120, "min_periods": 101}, "no window holds 101 values"),
    ],
)
def test_bad_arguments_are_refused_before_running(kwargs, message):
    with pytest.raises(MemchunkError) as info:
        daily(days=100).memchunk.plan("rolling", **kwargs)
    assert message in str(info.value)


def test_one_sided_depth_for_a_user_function(threaded):
    def trailing_sum(block):
        out = np.cumsum(block, axis=0)
        out[3:] = out[3:] - out[:-3]
        return out

    op = BlockwiseOperator("trailing-sum", trailing_sum, depth={"time": (2, 0)}, memory_model=None)
    tas = daily(days=60, lat=4, lon=5, chunks={"time": 10}, dtype="float64")
    result = tas.memchunk.apply(op, chunks={"time": 12})
    expected = tas.rolling(time=3, min_periods=1).sum()
    np.testing.assert_allclose(result.values, expected.values, rtol=1e-9)
    for bad in ((-1, 0), (1, 2, 3), 2.7, "2"):
        with pytest.raises(MemchunkError, match="a halo is an int >= 0"):
            BlockwiseOperator("bad", trailing_sum, depth={"time": bad})


def test_a_window_longer_than_the_dim_is_xarrays_too(threaded):
    tas = daily(days=40, lat=3, lon=4, chunks={"time": 10})
    result = tas.memchunk.apply("rolling", dim="time", window=60, min_periods=1)
    expected = tas.rolling(time=60, min_periods=1).mean()
    np.testing.assert_allclose(result.values, expected.values, **FLOAT32)


def test_rolling_can_be_calibrated_and_shipped_calibrations_skip_it():
    from calibrate_shipped import shipped

    from xarray_memchunk.operators import get_operator

    assert all(op.name != "rolling" for op, _, _ in shipped("cpu"))  # measured, not shipped
    kwargs, shapes = get_operator("rolling").calibration_setup(window=7)
    assert kwargs["window"] == 7 and kwargs["dim"] == "time" and len(shapes) >= 3


def test_rolling_on_a_cluster_is_safe_and_equal(cluster_client, tmp_path):
    make, Client = cluster_client
    path = tmp_path / "daily.zarr"
    daily(days=2000, lat=60, lon=90).to_dataset().to_zarr(path)  # 43 MB, one-day chunks
    tas = xr.open_zarr(path)["tas"]
    with make("400MB") as cluster, Client(cluster) as client:
        plan = tas.memchunk.plan("rolling", dim="time", window=30, center=True)
        outcome = run_watched(client, "rolling", lambda: plan.apply().sum())
        result = plan.apply().compute()
    assert outcome.completed and outcome.pauses == 0 and outcome.worker_deaths == 0
    expected = tas.load().rolling(time=30, center=True).mean()
    np.testing.assert_allclose(result.values, expected.values, **FLOAT32, equal_nan=True)


def test_a_packed_input_is_written_as_the_new_values_not_in_its_packing(tmp_path, threaded):
    """The sums of a packed int16 (scale 0.01) overflow its packing: the result drops it."""
    days = 400
    packed = xr.Dataset(
        {"q": (("time", "x"), np.full((days, 3), 10.0))},
        coords={"time": np.arange(days)},
    )
    encoding = {"q": {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -32767}}
    packed.to_netcdf(tmp_path / "packed.nc", encoding=encoding)
    q = xr.open_dataset(tmp_path / "packed.nc", chunks={})["q"]
    result = q.memchunk.apply("rolling", dim="time", window=365, reduction="sum")
    assert result.encoding == q.rolling(time=365).sum().encoding == {}
    result.memchunk.to_zarr(tmp_path / "sums.zarr")
    written = xr.open_zarr(tmp_path / "sums.zarr")["q"]
    np.testing.assert_allclose(written.values, result.values, equal_nan=True)
    assert float(written.max()) == pytest.approx(3650.0)

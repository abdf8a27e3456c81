"""Resampling along time: chunks end at bin edges, each task reduces its own bins (flox)."""

import dask
import numpy as np
import pytest
import xarray as xr
from daily_data import daily

import xarray_memchunk  # the accessor, and calibrate
from xarray_memchunk.errors import MemchunkError
from xarray_memchunk.operators.resample import bin_edges
from xarray_memchunk.planning.balance import packed_chunks
from xarray_memchunk.testing import run_watched


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path / "calibrations"))
    # every reduction and frequency measures itself on its first plan: a short bound
    with dask.config.set({"memchunk.self-calibration-seconds": 2}):
        yield


def starts_of_bins(chunks, edges):
    """Whether every chunk ends at one of ``edges``."""
    return set(np.cumsum(chunks)) <= set(edges)


def test_packed_chunks_hold_whole_spans_up_to_the_longest():
    assert packed_chunks([31, 59, 90, 120], 60) == (59, 31, 30)
    assert packed_chunks([31, 59, 90, 120], 61) == (59, 61)
    assert packed_chunks([31, 59, 90, 120], 120) == (120,)
    assert packed_chunks([31, 59, 90, 120], 31) == (31, 28, 31, 30)
    with pytest.raises(ValueError, match="longer than chunks of 30"):
        packed_chunks([31, 59], 30)


def test_bin_edges_are_where_xarray_bins_end():
    tas = daily(days=100)
    edges = bin_edges(tas, "time", "1MS")
    assert edges == (31, 59, 90, 100)  # 2001: January, February (28 days), March, 10 of April
    assert bin_edges(tas, "time", "7D")[:2] == (7, 14)


@pytest.mark.parametrize("reduction", ["mean", "sum", "max", "median", "std", "count"])
def test_equals_xarray_and_never_cuts_a_bin(reduction, threaded):
    tas = daily(days=400, chunks={"time": 1})
    plan = tas.memchunk.plan("resample", freq="1MS", reduction=reduction, chunks={"time": 45})
    edges = bin_edges(tas, "time", "1MS")
    assert len(plan.dask_chunks["time"]) > 1 and starts_of_bins(plan.dask_chunks["time"], edges)
    assert any("whole bins, never cut" in note for note in plan.notes)  # 45 is not a bin edge
    result = plan.apply()
    expected = getattr(tas.resample(time="1MS"), reduction)()
    xr.testing.assert_allclose(result.compute(), expected.compute(), atol=1e-6)


def test_planned_chunks_are_whole_bins_and_time_is_cut_when_memory_binds():
    tas = daily(days=3 * 365, lat=60, lon=80, chunks={"time": 1})
    plan = tas.memchunk.plan("resample", freq="1MS", memory_limit="600MB")
    assert plan.fits
    edges = bin_edges(tas, "time", "1MS")
    chunks = plan.dask_chunks["time"]
    assert len(chunks) > 1 and starts_of_bins(chunks, edges)  # time is not whole
    assert max(chunks) >= 31  # at least the longest bin


def test_dataset_is_resampled_as_xarray_resamples_it(threaded):
    ds = daily(days=120, lat=4, lon=5, chunks={"time": 10}).to_dataset()
    ds["orography"] = xr.DataArray(np.ones((4, 5)), dims=("lat", "lon"))
    result = ds.memchunk.apply("resample", freq="1MS")
    expected = ds.resample(time="1MS").mean()
    assert set(result.data_vars) == set(expected.data_vars)
    xr.testing.assert_allclose(result.compute(), expected.compute(), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs freq="),
        ({"freq": "1MS", "reduction": "mode"}, "reduction must be one of"),
        ({"freq": "1MS", "how": "mean"}, "unexpected arguments ['how']"),
        ({"freq": "fortnightly"}, "cannot bin 'time' by freq='fortnightly'"),
    ],
)
def test_bad_arguments_are_refused_before_running(kwargs, message):
    with pytest.raises(MemchunkError) as info:
        daily(days=60).memchunk.plan("resample", **kwargs)
    assert message in str(info.value)


def test_dates_that_do_not_increase_are_refused():
    tas = daily(days=60).isel(time=slice(None, None, -1))
    with pytest.raises(MemchunkError, match="increasing time coordinate"):
        tas.memchunk.plan("resample", freq="1MS")
    with pytest.raises(MemchunkError, match="measured on its first plan"):
        xarray_memchunk.calibrate("resample", freq="1MS")


def test_resample_on_a_cluster_reads_storage_chunks_and_is_safe(cluster_client, tmp_path):
    make, Client = cluster_client
    path = tmp_path / "daily.zarr"
    daily(days=1500, lat=60, lon=90).to_dataset().to_zarr(path)  # 32 MB, one-day chunks
    tas = xr.open_zarr(path)["tas"]
    with make("400MB") as cluster, Client(cluster) as client:
        plan = tas.memchunk.plan("resample", freq="1MS", reduction="median")
        outcome = run_watched(client, "resample", lambda: plan.apply())
        result = plan.apply().compute()
    assert outcome.completed and outcome.pauses == 0 and outcome.worker_deaths == 0
    assert plan.storage_aligned  # one-day storage chunks: whole months read as stored
    expected = tas.load().resample(time="1MS").median()
    xr.testing.assert_allclose(result, expected, atol=1e-6)


@pytest.mark.parametrize("calendar", ["standard", "noleap"])
@pytest.mark.parametrize(
    ("op", "kwargs", "expected"),
    [
        ("resample", {"freq": "MS"}, lambda ds: ds.resample(time="MS").mean()),
        ("groupby", {"by": "time.month"}, lambda ds: ds.groupby("time.month").mean()),
    ],
)
def test_time_bounds_are_reduced_as_xarray_reduces_them(calendar, op, kwargs, expected, threaded):
    """Time bounds (dates, cftime objects in a noleap calendar) are not planned, and were
    left out of the result, whose ``time`` still named them as its bounds; xarray keeps them.
    They are reduced beside the plan with xarray's own method: flox's blockwise one fails on
    datetimes."""
    cftime = calendar == "noleap"
    time = xr.date_range("2000-01-01", periods=730, freq="D", calendar=calendar, use_cftime=cftime)
    ends = xr.date_range("2000-01-02", periods=730, freq="D", calendar=calendar, use_cftime=cftime)
    tas = xr.DataArray(np.random.default_rng(0).random((730, 4, 5), "f4"), dims=("time", "y", "x"))
    bounds = np.stack([np.asarray(time), np.asarray(ends)], axis=1)
    ds = xr.Dataset({"tas": tas, "time_bnds": (("time", "bnds"), bounds)}, coords={"time": time})
    ds = ds.chunk({"time": 100})
    plan = ds.memchunk.plan(op, memory_limit="1GB", **kwargs)
    (note,) = [n for n in plan.notes if n.startswith("not planned: time_bnds")]
    assert "reduced over the" in note and ".astype" not in note
    result = plan.apply().compute()
    want = expected(ds).compute()
    assert (result.time_bnds.values == want.time_bnds.values).all()
    xr.testing.assert_allclose(result.tas, want.tas, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "kwargs"),
    [
        ("groupby", {"by": "time.month", "reduction": "median"}),
        ("resample", {"freq": "MS", "reduction": "var"}),
        ("resample", {"freq": "MS", "reduction": "sum"}),
    ],
)
def test_time_bounds_are_left_out_where_xarray_cannot_reduce_dates(op, kwargs, threaded):
    """xarray's groupby median fails on dates (and var on cftime dates), and a sum of dates
    is no bounds (datetime64 wraps round to 1732): the result is computed without them, as
    before, with a note, rather than fail whole or write bogus bounds."""
    time = xr.date_range("2000-01-01", periods=730, freq="D", calendar="noleap", use_cftime=True)
    tas = xr.DataArray(np.random.default_rng(0).random((730, 4, 5), "f4"), dims=("time", "y", "x"))
    bounds = np.stack([np.asarray(time), np.asarray(time)], axis=1)
    ds = xr.Dataset({"tas": tas, "time_bnds": (("time", "bnds"), bounds)}, coords={"time": time})
    plan = ds.chunk({"time": 100}).memchunk.plan(op, memory_limit="1GB", **kwargs)
    (note,) = [n for n in plan.notes if n.startswith("not planned: time_bnds")]
    assert "left out of the result" in note
    result = plan.apply().compute()
    assert list(result.data_vars) == ["tas"]


@pytest.mark.parametrize(
    ("op", "kwargs", "expected"),
    [
        ("resample", {"freq": "1MS"}, lambda ds: ds.resample(time="1MS").mean()),
        ("groupby", {"by": "time.month"}, lambda ds: ds.groupby("time.month").mean()),
        ("mean", {"dim": "time"}, lambda ds: ds.mean("time")),
    ],
)
def test_a_coordinate_along_a_dim_no_variable_has_is_kept_as_xarray_keeps_it(
    op, kwargs, expected, threaded
):
    """A new user's ``lev``, left after ``deptho`` was dropped, was lost by all three."""
    ds = daily(days=120).to_dataset().assign_coords(lev=("lev", np.arange(5.0)))
    result = ds.memchunk.apply(op, memory_limit="1GB", **kwargs)
    assert "lev" in result.coords
    xr.testing.assert_allclose(result.compute(), expected(ds).compute(), atol=1e-6)

"""Grouped reductions: flox's map-reduce or blockwise method, chosen with the chunks."""

import dask
import numpy as np
import pytest
import xarray as xr
from daily_data import daily

import xarray_memchunk  # the accessor, and calibrate
from xarray_memchunk.errors import InfeasiblePlanError, MemchunkError
from xarray_memchunk.operators import get_operator
from xarray_memchunk.operators.groupby import group_starts
from xarray_memchunk.testing import run_watched


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path / "calibrations"))
    # every grouping, reduction and method measures itself on its first plan: a short bound
    with dask.config.set({"memchunk.self-calibration-seconds": 2}):
        yield


def test_group_starts_count_the_groups_in_each_prefix():
    tas = daily(days=100)
    dim, starts = group_starts(tas, "time.month")
    assert dim == "time" and starts == (0, 31, 59, 90)  # January to April 2001
    with pytest.raises(MemchunkError, match="not a coordinate of the data"):
        group_starts(tas, "region")


@pytest.mark.parametrize("method", ["map-reduce", "blockwise"])
@pytest.mark.parametrize("reduction", ["mean", "std", "max"])
def test_equals_xarray_by_either_method(method, reduction, threaded):
    tas = daily(days=400, chunks={"time": 1})
    plan = tas.memchunk.plan("groupby", by="time.month", reduction=reduction, method=method)
    chunks = plan.dask_chunks["time"]
    assert (len(chunks) == 1) == (method == "blockwise")  # map-reduce cuts time
    result = plan.apply()
    expected = getattr(tas.groupby("time.month"), reduction)()
    xr.testing.assert_allclose(result.compute(), expected.compute(), atol=1e-6)


def test_median_is_blockwise_and_the_plan_says_which_method_it_chose(threaded):
    tas = daily(days=400, chunks={"time": 1})
    median = tas.memchunk.plan("groupby", by="time.month", reduction="median")
    assert median.dask_chunks["time"] == (400,)
    xr.testing.assert_allclose(
        median.apply().compute(), tas.compute().groupby("time.month").median(), atol=1e-6
    )
    mean = tas.memchunk.plan("groupby", by="time.month")
    chosen = [n for n in mean.notes if "chosen" in n]
    assert len(chosen) == 1 and "estimated" in chosen[0]  # the other method, and its time


def test_day_of_year_partials_are_counted_per_group():
    """A day-of-year map-reduce task holds 366 groups of partials per location."""
    tas = daily(days=3 * 365, lat=8, lon=10)
    op = get_operator("groupby")
    kwargs = op.check_arguments(op.check_arguments({"by": "time.dayofyear"}), tas)
    cost = op.cost(tas, **kwargs | {"method": "map-reduce"})
    features = cost.features({"time": np.array([10.0]), "lat": np.array([8.0]), "lon": [10.0]})
    assert features["partial_bytes"][0] == 8 * 10 * 365 * 16  # 365 days of 2001-2003
    assert features["combine_bytes"][0] == features["partial_bytes"][0] * 4 * 2
    month = op.check_arguments(op.check_arguments({"by": "time.month"}), tas)
    small = op.cost(tas, **month | {"method": "map-reduce"}).features(
        {"time": np.array([10.0]), "lat": np.array([8.0]), "lon": [10.0]}
    )
    assert small["partial_bytes"][0] == 8 * 10 * 12 * 16


def test_dataset_keeps_variables_without_the_dim(threaded):
    ds = daily(days=120, lat=4, lon=5, chunks={"time": 10}).to_dataset()
    ds["orography"] = xr.DataArray(np.ones((4, 5)), dims=("lat", "lon"))
    ds["label"] = xr.DataArray(list("abcd"), dims="lat")
    plan = ds.memchunk.plan("groupby", by="time.month")
    # the notes say what becomes of each (they said "left out", from by= before its dim was
    # bound, and "kept" for text that xarray's mean leaves out)
    notes = " ".join(plan.notes)
    assert "orography (has no dim 'time': broadcast along the groups" in notes
    assert "label (has no dim 'time' and is of dtype <U1: left out of the result" in notes
    result = plan.apply()
    expected = ds.groupby("time.month").mean()
    assert expected["orography"].dims == ("month", "lat", "lon")
    assert "label" not in expected
    assert set(result.data_vars) == set(expected.data_vars)
    xr.testing.assert_allclose(result.compute(), expected.compute(), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs by="),
        ({"by": "time.month", "reduction": "mode"}, "reduction must be one of"),
        ({"by": "time.month", "method": "cohorts"}, "method must be one of"),
        ({"by": "time.month", "reduction": "median", "method": "map-reduce"}, "needs method="),
        ({"by": "time.month", "engine": "numba"}, "unexpected arguments ['engine']"),
    ],
)
def test_bad_arguments_are_refused_before_running(kwargs, message):
    with pytest.raises(MemchunkError) as info:
        daily(days=60).memchunk.plan("groupby", **kwargs)
    assert message in str(info.value)
    with pytest.raises(MemchunkError, match="measured on its first plan"):
        xarray_memchunk.calibrate("groupby", by="time.month")


def test_groupby_on_a_cluster_is_safe_and_equal(cluster_client, tmp_path):
    make, Client = cluster_client
    path = tmp_path / "daily.zarr"
    daily(days=1500, lat=60, lon=90).to_dataset().to_zarr(path)  # 32 MB, one-day chunks
    tas = xr.open_zarr(path)["tas"]
    with make("400MB") as cluster, Client(cluster) as client:
        plan = tas.memchunk.plan("groupby", by="time.month", method="map-reduce")
        outcome = run_watched(client, "groupby", lambda: plan.apply())
        result = plan.apply().compute()
    assert outcome.completed and outcome.pauses == 0 and outcome.worker_deaths == 0
    expected = tas.load().groupby("time.month").mean()
    xr.testing.assert_allclose(result, expected, atol=1e-6)


def test_day_of_year_map_reduce_is_refused_where_its_partials_outweigh_the_data(threaded):
    """4 x 366 partials per location (16 B each for a mean) against 1500 float32 days."""
    tas = daily(days=1500)
    with pytest.raises(InfeasiblePlanError, match="method='blockwise' needs less memory"):
        tas.memchunk.plan("groupby", by="time.dayofyear", method="map-reduce")
    plan = tas.memchunk.plan("groupby", by="time.dayofyear")
    assert plan.dask_chunks["time"] == (1500,)
    assert "map-reduce's combine tasks hold 4 x 366 groups" in plan.explain()
    # ten years of float64: 29200 B per location against 23424 B of partials, so both are priced
    plan = daily(days=3650, dtype="float64").memchunk.plan("groupby", by="time.dayofyear")
    assert "map-reduce's combine tasks" not in plan.explain()


def test_with_flox_off_the_notes_say_the_method_is_only_a_chunk_layout(threaded):
    """xarray without flox reduces each group itself: a note naming flox's method misled."""
    tas = daily(days=400, chunks={"time": 1})
    with xr.set_options(use_flox=False):
        plan = tas.memchunk.plan("groupby", by="time.month")
        result = plan.apply().compute()
    (chosen,) = [n for n in plan.notes if "chosen" in n]
    assert "(flox is off: its chunk layout, xarray reduces) chosen" in chosen
    xr.testing.assert_allclose(result, tas.groupby("time.month").mean().compute(), atol=1e-6)


@pytest.mark.parametrize("dtype", [object, "M8[ns]"])
def test_dates_broadcast_by_a_where_are_left_out_without_being_computed(dtype):
    """A new user's ``ds.where(ds.pr >= 0)`` broadcast ``time_bnds`` to a 2 GB array of
    cftime dates; planning computed its first chunk on the cluster to ask whether it held
    dates, and killed 4 workers before it could refuse. Here computing it fails."""

    def never(block):
        raise AssertionError("the broadcast dates were computed")

    tas = daily(days=365, lat=60, lon=100, chunks={"time": 365})
    broadcast = dask.array.empty((365, 2, *tas.shape[1:]), dtype=dtype, chunks=-1)
    bounds = (("time", "bnds", "lat", "lon"), broadcast.map_blocks(never, dtype=dtype))
    ds = tas.to_dataset().assign(time_bnds=bounds)
    assert ds.time_bnds.nbytes > 16 * 2**20 and broadcast.chunksize[0] == 365
    plan = ds.memchunk.plan("groupby", by="time.month", reduction="mean", memory_limit="2GB")
    assert any("'time_bnds' along 'time': left out" in note for note in plan.notes)
    assert list(plan.apply().data_vars) == ["tas"]
    # nothing is sized for it: the result drops it (a note said how it was chunked to fit)
    assert "time_bnds" not in plan._prepared.kept
    assert not any(n.startswith("time_bnds: xarray's task") for n in plan.notes)

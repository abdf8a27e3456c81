"""A Dataset's variables an operator keeps unplanned: xarray's tasks on them fit the budget."""

import dask
import numpy as np
import pytest
import xarray as xr
from daily_data import daily

import xarray_memchunk
from xarray_memchunk.measure.runs import Run, beside_layers
from xarray_memchunk.operators.kept_variables import KEPT_SHARE
from xarray_memchunk.operators.sources import READ_PREFIX


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path / "calibrations"))
    with dask.config.set({"memchunk.self-calibration-seconds": 2}):
        yield


def with_depth(levels=50, lat=90, lon=180, days=730):
    """Daily tas and a static deptho(lev, lat, lon) in one chunk, as open_mfdataset gives it."""
    tas = daily(days=days, lat=lat, lon=lon, chunks={"time": 73})
    rng = np.random.default_rng(1)
    deptho = xr.DataArray(
        rng.random((levels, lat, lon), dtype="float32"), dims=("lev", "lat", "lon")
    )
    return xr.Dataset({"tas": tas, "deptho": deptho.chunk()})


def note_on(plan, name):
    (note,) = [n for n in plan.notes if n.startswith(f"{name}: xarray's task")]
    return note


@pytest.mark.parametrize(
    ("op", "kwargs"),
    [("resample", {"freq": "MS"}), ("groupby", {"by": "time.month"})],
)
def test_a_static_field_broadcast_along_the_groups_is_chunked_so_each_task_fits(
    op, kwargs, threaded
):
    levels = 100 if op == "resample" else 200  # half the groups: twice the levels
    ds = with_depth(levels=levels)
    plan = ds.memchunk.plan(op, memory_limit="500MB", **kwargs)
    kept = plan._prepared.kept["deptho"]
    groups = 24 if op == "resample" else 12
    # broadcast along the groups, made contiguous, then encoded once: twice the groups
    assert kept.bytes_per_input_byte > 2 * groups
    slot = KEPT_SHARE * plan.budget.per_task
    assert kept.bytes_per_input_byte * ds.deptho.nbytes > slot  # whole: over
    assert kept.chunks is not None and kept.chunks["lev"] < levels
    assert kept.chunks["lat"] == 90 and kept.chunks["lon"] == 180  # its own dim cut first
    assert kept.task_bytes <= slot
    assert "so that it fits 50% of the per-task budget" in note_on(plan, "deptho")
    result = plan.apply()
    chunks = result.deptho.data.chunks
    held = 4 * groups * max(chunks[1]) * max(chunks[2]) * max(chunks[3]) * 2
    assert held <= slot
    grouped = ds.resample(time="MS") if op == "resample" else ds.groupby("time.month")
    expected = grouped.mean()
    xr.testing.assert_allclose(result.compute(), expected.compute(), atol=1e-6)


def test_std_of_a_variable_without_time_is_sized_by_xarray_s_float64_moments(threaded):
    ds = with_depth(levels=20)
    plan = ds.memchunk.plan("std", dim="time", memory_limit="400MB")
    kept = plan._prepared.kept["deptho"]
    assert kept.bytes_per_input_byte > 6  # float32 in, several float64 moments
    assert kept.task_bytes == pytest.approx(kept.bytes_per_input_byte * ds.deptho.nbytes, rel=0.01)
    xr.testing.assert_allclose(plan.apply().compute(), ds.std("time").compute())


def test_a_kept_variable_that_fits_keeps_its_chunks(threaded):
    ds = with_depth(levels=2)
    plan = ds.memchunk.plan("resample", freq="MS", memory_limit="2GB")
    kept = plan._prepared.kept["deptho"]
    assert kept.chunks is None
    assert plan.apply().deptho.data.chunks[1:] == ((2,), (90,), (180,))
    # a note where its task takes a tenth of its slot or more, none for a small one
    assert not [n for n in plan.notes if n.startswith("deptho: xarray's task")]
    larger = with_depth(levels=40).memchunk.plan("resample", freq="MS", memory_limit="2GB")
    assert larger._prepared.kept["deptho"].chunks is None  # 121 MiB within a 281 MiB slot
    assert "within 50% of the per-task budget" in note_on(larger, "deptho")


def test_a_kept_variable_from_files_is_read_in_its_chunks(tmp_path, threaded):
    ds = with_depth(levels=40).compute()
    paths = []
    for year, part in ds.groupby("time.year"):
        paths.append(tmp_path / f"{year}.nc")
        part.to_netcdf(paths[-1])
    opened = xr.open_mfdataset(paths, data_vars="minimal", coords="minimal", compat="override")
    assert opened.deptho.data.npartitions == 1  # the whole variable, from the first file
    plan = opened.memchunk.plan("resample", freq="MS", memory_limit="400MB")
    kept = plan._prepared.kept["deptho"]
    assert kept.chunks is not None
    result = plan.apply()
    layers = result.deptho.data.dask.layers
    assert any(str(name).startswith(READ_PREFIX) for name in layers)
    assert max(result.deptho.data.chunks[1]) == kept.chunks["lev"]
    expected = ds.resample(time="MS").mean()
    xr.testing.assert_allclose(result.compute(), expected)
    opened.close()


def test_variables_an_operator_leaves_out_are_not_sized(threaded):
    ds = with_depth(levels=4)

    @xarray_memchunk.operator(whole=["time"], xarray=True)
    def anomaly(tas):
        return tas - tas.mean("time")

    with pytest.warns(UserWarning, match="leaves 'deptho' out"):
        plan = ds.memchunk.plan(anomaly)
        result = plan.apply()
    assert plan._prepared.kept == {}
    assert "deptho" not in result


@pytest.mark.cluster
def test_a_resample_with_a_large_static_field_never_pauses_a_worker(cluster_client, tmp_path):
    make, Client = cluster_client
    ds = with_depth(levels=80, lat=180, lon=360, days=730)  # deptho 19.8 MiB, x24 months
    with make("1GB") as cluster, Client(cluster):
        plan = ds.memchunk.plan("resample", freq="MS")
        assert plan._prepared.kept["deptho"].chunks is not None
        result = plan.apply()
        result.memchunk.to_zarr(tmp_path / "monthly.zarr")
        report = plan.report(learn=False)
    assert report.pauses == 0 and report.worker_deaths == 0
    # xarray's tasks on deptho (about 0.9x its prediction) are not counted as the operator's
    kept = plan._prepared.kept["deptho"]
    assert report.n_tasks > 0 and report.measured_task_bytes < 0.75 * kept.task_bytes, report


def test_a_kept_variable_s_tasks_are_told_apart_by_layer_even_fused_into_a_write(threaded):
    ds = with_depth(levels=4)
    result = ds.memchunk.plan("resample", freq="MS").apply()
    beside, prefixes = beside_layers(result, ["deptho"])
    run = Run(0.0, lambda: None, frozenset(), frozenset(), beside=beside, beside_prefixes=prefixes)
    assert prefixes == {"broadcast_to"}  # only deptho's graph broadcasts
    assert run.is_beside("broadcast_to-rechunk-merge-rechunk-split-store-map-0282c7e998bc")
    assert not run.is_beside("rechunk-merge-store-map-0282c7e998bc")
    assert not any(run.is_beside(n) for n in result.tas.data.dask.layers)

    ds["tas"] = ds.tas + xr.zeros_like(ds.deptho.isel(lev=0)).broadcast_like(ds.tas)
    plan = ds.memchunk.plan("resample", freq="MS")
    result = plan.apply()
    beside, prefixes = beside_layers(result, ["deptho"])
    run = Run(0.0, lambda: None, frozenset(), frozenset(), beside=beside, beside_prefixes=prefixes)
    (layer,) = [n for n in beside if n.startswith("broadcast_to-")]
    token = layer.rsplit("-", 1)[1]
    assert run.is_beside(layer) and run.is_beside(f"xarray-deptho-broadcast_to-{token}")
    # tas's own graph broadcasts too: a fused name without deptho's token is not told apart
    assert "broadcast_to" not in prefixes
    assert not run.is_beside("broadcast_to-rechunk-merge-store-map-0282c7e998bc")
    assert not any(run.is_beside(n) for n in result.tas.data.dask.layers)

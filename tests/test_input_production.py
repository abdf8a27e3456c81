"""What producing the input costs is measured and planned for (issue 28, item 4)."""

import dask
import dask.array as da
import pytest
import xarray as xr

from xarray_memchunk.operators import production
from xarray_memchunk.operators.production import input_production


def preprocessed(shape=(400, 221, 300), seed=1):
    data = da.random.default_rng(seed).standard_normal(shape, chunks=(100, 221, 300))
    return xr.DataArray(data.astype("float32"), dims=("time", "y", "x"), name="anomaly")


def test_producing_a_float32_block_from_float64_is_measured_once():
    array = preprocessed()
    first = input_production(array)
    block = 4 * 100 * 221 * 300
    assert first.block_bytes == block
    # the float64 block it is made from: twice the float32 block, at least
    assert first.extra_bytes >= 1.5 * block
    assert input_production(array) is first  # cached by graph: measured once
    assert array.data.name in production._CACHE


def test_data_cut_from_numpy_or_a_generator_is_not_measured():
    numpy_cut = xr.DataArray(da.zeros((100, 100), chunks=50), dims=("y", "x"))
    generated = xr.DataArray(
        da.random.default_rng(0).random((100, 100), chunks=50), dims=("y", "x")
    )
    assert input_production(numpy_cut) is None
    assert input_production(generated) is None
    with dask.config.set({"memchunk.measure-input": False}):
        assert input_production(preprocessed(seed=2)) is None


def test_the_plan_keeps_room_for_producing_its_input():
    array = preprocessed(seed=3)
    plan = array.memchunk.plan("mean", dim="time", memory_limit="1GB")
    assert plan.produce_bytes >= 1.5 * 4 * 100 * 221 * 300  # the float64 block, at least
    assert plan.produce_bytes == input_production(array).extra_bytes
    assert plan.predicted_peak_bytes >= plan.predicted_task_bytes + plan.produce_bytes
    assert "producing its input" in plan.explain()
    assert any("measured now, in this process" in n for n in plan.notes)


@pytest.mark.cluster
def test_the_issue_mean_on_two_threads_per_worker_runs_without_pause(quiet_distributed):
    """The issue's reproduction, smaller: 2 pauses at 0.63 and 0.7 GB before."""
    from distributed import Client, LocalCluster

    from xarray_memchunk.testing import run_watched

    data = da.random.default_rng(1).standard_normal((1262, 221, 313), chunks="auto")
    array = xr.DataArray(data.astype("float32"), dims=("time", "y", "x"))
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, memory_limit="1GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = array.memchunk.plan("mean", dim="time")
        outcome = run_watched(client, "mean", lambda: array.memchunk.apply("mean", dim="time").data)
    assert plan.produce_bytes > 0
    assert outcome.completed and outcome.pauses == 0 and outcome.worker_deaths == 0


@pytest.mark.cluster
def test_persisted_data_is_planned_without_measuring_its_production(quiet_distributed):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster),
    ):
        kept = da.random.default_rng(4).random((40, 30, 20), chunks=(10, 30, 20)).persist()
        array = xr.DataArray(kept * 2 + 1, dims=("time", "y", "x"))
        plan = array.memchunk.plan("median", dim="time", memory_limit="1GB")
    assert plan.produce_bytes == 0  # its blocks live in the workers: nothing computed here

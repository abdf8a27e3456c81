"""Rechunking through disk where memory cannot (issue 28, item 2)."""

import shutil
from collections import namedtuple

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.operators import staging


def time_chunked(shape=(600, 200, 200), chunks=(50, 200, 200)):
    data = da.random.default_rng(3).random(shape, chunks=chunks, dtype="float64")
    return xr.DataArray(data, dims=("time", "y", "x"), name="t")


def test_a_rechunk_that_memory_cannot_hold_is_staged_on_disk():
    plan = time_chunked().memchunk.plan("median", dim="time", memory_limit="0.5GB")
    note = next(n for n in plan.notes if "temporary Zarr store" in n)
    assert "MB/s" in note  # the disk was measured
    assert plan.predicted_peak_bytes <= plan.budget.per_task
    # with memory to spare, nothing is written
    roomy = time_chunked().memchunk.plan("median", dim="time", memory_limit="0.8GB")
    assert not any("temporary Zarr store" in n for n in roomy.notes)


def test_staging_is_refused_without_room_on_disk(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        pytest.raises(xm.InfeasiblePlanError, match=r"Nor can it be staged on disk.*GB free"),
    ):
        time_chunked().memchunk.plan("median", dim="time", memory_limit="0.5GB")


@pytest.mark.cluster
def test_a_staged_median_runs_without_pause_and_equals_xarray(tmp_path, quiet_distributed):
    from distributed import Client, LocalCluster

    from xarray_memchunk.testing import run_watched

    data = time_chunked()
    expected = np.median(data.values, axis=0)
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="0.5GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = data.memchunk.plan("median", dim="time")
        assert any("temporary Zarr store" in n for n in plan.notes)
        result = {}

        def run():
            lazy = data.memchunk.apply("median", dim="time")
            result["median"] = lazy
            return lazy.data

        outcome = run_watched(client, "staged median", run)
        assert outcome.completed and outcome.pauses == 0 and outcome.worker_deaths == 0
        np.testing.assert_allclose(result["median"].values, expected)
    assert list(tmp_path.glob("memchunk-staged-*.zarr"))  # written there, removed at exit


def test_month_length_chunks_are_staged_in_equal_chunks(tmp_path, threaded):
    # monthly chunks (31, 28, 31, ...): Zarr wants equal chunks; the store's are 31 long
    months = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31) * 3
    data = da.random.default_rng(5).random((sum(months), 200, 200), chunks=(months, 200, 200))
    array = xr.DataArray(data, dims=("time", "y", "x"), name="t")
    with dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}):
        plan = array.memchunk.plan("median", dim="time", memory_limit="0.4GB")
        assert any("temporary Zarr store" in n for n in plan.notes)
        result = array.memchunk.apply("median", dim="time", memory_limit="0.4GB").values
    np.testing.assert_allclose(result, np.median(array.values, axis=0))


def test_a_failed_staging_write_leaves_nothing_and_says_so(tmp_path, threaded, monkeypatch):
    def failing_write(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(xr.Dataset, "to_zarr", failing_write)
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        pytest.raises(xm.MemchunkError, match=r"staging the data .* failed.*nothing is left"),
    ):
        time_chunked().memchunk.apply("median", dim="time", memory_limit="0.5GB")
    assert not list(tmp_path.glob("memchunk-staged-*"))

"""Memory behaviour on a real LocalCluster with a real memory_limit."""

import numpy as np
import pytest

from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic
from xarray_memchunk.testing import run_watched

pytestmark = pytest.mark.cluster


def test_median_over_long_time_naive_dies_planned_completes(cluster_client):
    make, Client = cluster_client
    # 1500 daily fields of 120 x 240 float32 (173 MB), stored one time step per chunk
    tas = synthetic_climate(1500, 120, 240, chunks={"time": 1}).tas

    with make("600MB") as cluster, Client(cluster) as client:
        naive = run_watched(client, "naive", lambda: tas.chunk({"time": -1}).median("time"))
    # the naive rechunk builds one 173 MB chunk, then nanmedian's copies on top of it
    assert (not naive.completed) or naive.worker_deaths > 0 or naive.pauses > 0

    with make("600MB") as cluster, Client(cluster) as client:
        plan = tas.memchunk.plan("median", dim="time")
        assert plan.budget.source.startswith("distributed client")
        assert plan.dask_chunks["time"] == (1500,)
        planned = run_watched(client, "memchunk", lambda: tas.memchunk.apply("median", dim="time"))
    assert planned.completed, planned.error
    assert planned.worker_deaths == 0
    assert planned.pauses == 0
    assert planned.peak_bytes < 0.8 * 600e6  # sampled RSS stayed below the pause threshold


def test_planned_result_is_correct_on_the_cluster(cluster_client):
    make, Client = cluster_client
    tas = synthetic_climate(100, 30, 40, chunks={"time": 1}).tas
    with make("1GB") as cluster, Client(cluster):
        median = tas.memchunk.apply("median", dim="T").compute()
    np.testing.assert_allclose(median.values, tas.load().median("time").values, rtol=1e-6)


def test_gst3d_plan_runs_without_pause_or_restart(cluster_client):
    make, Client = cluster_client
    volume = synthetic_seismic((160, 160, 160), chunks="auto")
    with make("1GB") as cluster, Client(cluster) as client:
        plan = volume.memchunk.plan("gst3d")
        outcome = run_watched(client, "memchunk", lambda: volume.memchunk.apply("gst3d"))
    assert outcome.completed, outcome.error
    assert outcome.worker_deaths == 0 and outcome.pauses == 0
    assert plan.n_chunks >= 2
    # measured worker RSS (baseline included) within the prediction plus the idle worker
    assert outcome.peak_bytes < plan.predicted_peak_bytes + plan.budget.worker_baseline


def test_a_run_not_done_in_time_is_stopped_and_recorded(cluster_client):
    import time

    import dask

    make, Client = cluster_client
    slow = dask.delayed(time.sleep)(30)
    with make("600MB") as cluster, Client(cluster) as client:
        outcome = run_watched(client, "slow", lambda: slow, timeout=1)
    assert not outcome.completed
    assert outcome.error.startswith("TimeoutError: not done after 1 s")
    assert outcome.seconds < 10


def test_a_retired_worker_is_not_counted_as_a_death():
    """An adaptive cluster scaling down removes workers expectedly: a trial's watch counted
    one such removal as a worker death under a plan that fit."""
    from xarray_memchunk.testing import _EventLog

    def removal(worker, expected):
        return {"action": "remove-worker", "worker": worker, "expected": expected}

    class Client:
        def get_events(self):
            return {"all": [(10.0, removal("retired", True)), (11.0, removal("killed", False))]}

    log = _EventLog(Client(), since=0.0)
    log.poll()
    assert {worker for worker, _ in log.deaths} == {"killed"}

"""The task-peaks plugin on workers that share a process (a cluster of threads)."""

import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, wait

from xarray_memchunk.measure.task_peaks import PLUGIN_NAME, TaskPeaks

MiB = 2**20

pytestmark = pytest.mark.cluster


def _hold(i: int, started: float) -> int:
    """Hold 150 MiB for a second, written (resident), with the other task at the same time."""
    block = np.ones(150 * MiB // 8)
    time.sleep(max(0.0, started + 1.0 - time.time()))
    return int(block[0]) + i


def _records(dask_worker) -> list[tuple[int, int]]:
    plugin = dask_worker.plugins[PLUGIN_NAME]
    return [(r.peak_bytes, r.overlap) for r in plugin.records if r.name.startswith("_hold")]


def test_two_workers_in_one_process_share_what_their_tasks_grew():
    # two single-threaded workers in one process, a task on each at once: each worker used to
    # reset and read the process's high-water mark as its own, and counted the other's 150 MiB
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(TaskPeaks(), name=PLUGIN_NAME)
        workers = list(client.scheduler_info()["workers"])
        started = time.time()
        futures = [
            client.submit(_hold, i, started, workers=[w], pure=False, key=f"_hold-{i}")
            for i, w in enumerate(workers)
        ]
        wait(futures)
        records = [r for rs in client.run(_records).values() for r in rs]
    assert len(records) == 2
    for peak, overlap in records:
        assert overlap == 2
        assert 120 * MiB < peak / overlap < 190 * MiB, (peak / MiB, overlap)

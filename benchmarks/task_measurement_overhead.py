"""What measuring every task's peak costs: wall time with and without the worker plugin.

    python benchmarks/task_measurement_overhead.py

Two workloads, each on a fresh LocalCluster (2 workers x 1 thread x 2GB) per run, measurement
on and off alternated (``memchunk.measure-tasks``), median of ``--repeats``: GST3D on 256^3 (a
few tasks of about a second) and a mean with 1200 tasks of a few milliseconds (the worst case:
the cost is per task). Also the cost of the plugin's two hooks alone, per task, in this process.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import dask

import xarray_memchunk  # noqa: F401
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic


def workloads():
    volume = synthetic_seismic((256, 256, 256), chunks="auto")
    climate = synthetic_climate(1200, 100, 120, chunks={"time": 1})
    return {
        "gst3d 256^3": lambda: volume.memchunk.apply("gst3d").dip.data.sum(),
        "mean, 1200 tasks": lambda: climate.memchunk.apply(
            "mean", dim="time", chunks={"time": 1}
        ).tas.data.sum(),
    }


def timed(build, measure: bool) -> float:
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"memchunk.measure-tasks": measure}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="2GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(lambda: __import__("xarray_memchunk"))
        result = build()
        start = time.perf_counter()
        result.compute()
        return time.perf_counter() - start


def hook_cost(n: int = 20000) -> float:
    """Microseconds per task for the plugin's start and end hooks, in this process."""
    from types import SimpleNamespace

    from xarray_memchunk.measure.task_peaks import TaskPeaks

    plugin = TaskPeaks()
    plugin.setup(SimpleNamespace(state=SimpleNamespace(nthreads=1)))
    start = time.perf_counter()
    for i in range(n):
        plugin.transition(("x", i), "ready", "executing")
        plugin.transition(("x", i), "executing", "memory")
    return 1e6 * (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    print(f"plugin hooks alone: {hook_cost():.0f} us per task (this process)")
    print(f"{'workload':<18} {'off s (median)':>15} {'on s (median)':>14} {'on / off':>9}")
    for label, build in workloads().items():
        seconds = {True: [], False: []}
        for i in range(args.repeats):
            for measure in (i % 2 == 0, i % 2 == 1):  # alternate which goes first
                seconds[measure].append(timed(build, measure))
        off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"{label:<18} {off:>15.2f} {on:>14.2f} {on / off:>9.3f}", flush=True)


if __name__ == "__main__":
    main()

"""A plan that says it fits runs with no pause and no worker death: measured on a LocalCluster.

A small version of ``benchmarks/plan_safety.py``: memory-bound plans (the binding constraint is
memory) of the operators and inputs that failed before, run on 2 workers x 1 thread with a real
``memory_limit``.
"""

import math
from dataclasses import replace

import numpy as np
import pytest
import xarray as xr
from harness.plan_safety import SafetyCase, most_tasks_near_minimum, run_case

from xarray_memchunk.operators import read_once
from xarray_memchunk.units import to_bytes

CUBE = {"time": 1000, "lat": 200, "lon": 300}


@pytest.mark.cluster
@pytest.mark.parametrize(
    "case",
    [
        # issue 17: std holds float64 moments (7.25 x a float32 chunk) in dask's graph
        SafetyCase(
            "std", "float32", CUBE, {"time": 1000, "lat": 50, "lon": 300}, "graph", {"dim": "time"}
        ),
        # source chunks cut by the plan: the worker holds several of them
        SafetyCase(
            "median",
            "float32",
            CUBE,
            {"time": 1000, "lat": 100, "lon": 300},
            "graph",
            {"dim": "time"},
        ),
        # a whole-dim reduction read from Zarr chunks that split the reduced dim
        SafetyCase(
            "quantile",
            "float64",
            CUBE,
            {"time": 100, "lat": 100, "lon": 100},
            "file",
            {"dim": "time", "q": 0.9},
        ),
        # a stencil read straight from Zarr, halos included
        SafetyCase(
            "gst3d",
            "float32",
            dict.fromkeys(("inline", "crossline", "sample"), 320),
            dict.fromkeys(("inline", "crossline", "sample"), 64),
            "file",
        ),
        # the same from a SEG-Y file: each task reads runs of whole traces for its block
        SafetyCase(
            "gst3d",
            "float32",
            dict.fromkeys(("inline", "crossline", "sample"), 320),
            dict.fromkeys(("inline", "crossline", "sample"), 64),
            "segy",
        ),
    ],
    ids=lambda c: f"{c.op}-{c.dtype}-{c.source}",
)
def test_memory_bound_plan_runs_without_pause_or_death(
    case, quiet_distributed, tmp_path, monkeypatch
):
    # plans that read the file's chunks in memory, as they come: where re-reads would cost
    # more, the plan stages the file instead, and is no longer bound by memory
    monkeypatch.setattr(read_once, "STAGING_GAIN", math.inf)
    result = run_case(case, tmp_path)
    assert result.binding == "memory", f"not memory-bound at {result.memory_limit}"
    assert result.completed, result.error
    assert result.pauses == 0 and result.deaths == 0
    assert result.peak_worker < 0.8 * to_bytes(result.memory_limit)


@pytest.mark.cluster
@pytest.mark.timeout(300)  # the plan that hung ran for over 10 minutes
def test_a_one_chunk_stencil_just_above_its_stated_minimum_runs_under_the_pause_line(
    quiet_distributed, tmp_path
):
    """A trial: a 200^3 volume made in one Dask chunk, gst3d just above the minimum a refusal
    stated, on 1 worker x 2 threads. Only the smallest chunks fit there: 10^3 (8,000 tasks,
    235,113 in the graph), whose worker paused at 437-467 MiB, and the run had not ended
    after 10 minutes. Every slicing task of a ready chunk is sent to the worker at once: Dask's
    record of each (about 5 KiB) and the halo slices (21 x the array) were held, which the
    plan did not count. The limit run is the one planned in most tasks up to 6% above the
    minimum.
    """
    volume = dict.fromkeys(("inline", "crossline", "sample"), 200)
    case = SafetyCase("gst3d", "float32", volume, volume, "graph", threads=2)
    limit = most_tasks_near_minimum(case, n_workers=1)
    result = run_case(replace(case, memory_limit=str(limit)), tmp_path, n_workers=1)
    assert result.completed, result.error
    assert result.pauses == 0 and result.deaths == 0
    assert result.peak_worker < 0.8 * limit


@pytest.mark.cluster
def test_workers_in_this_process_run_a_plan_under_its_pause_line(quiet_distributed, tmp_path):
    """An adaptive ``processes=False`` cluster: its 2 workers planned as one of 2 threads.

    The limit leaves room above what this test process holds (more, late in a suite), and
    the peak sampled is this process's memory, which both workers measure.
    """
    import psutil

    limit = psutil.Process().memory_info().rss + 1_000_000_000
    case = SafetyCase(
        "std",
        "float32",
        CUBE,
        {"time": 1000, "lat": 50, "lon": 300},
        "graph",
        {"dim": "time"},
        str(limit),
        deployment="in-process",
    )
    result = run_case(case, tmp_path)
    assert result.threads == 2  # one worker of both workers' threads
    assert result.completed, result.error
    assert result.pauses == 0 and result.deaths == 0
    assert 0 < result.peak_worker < 0.8 * limit


def test_issue_17_std_plan_knows_what_the_dask_task_holds():
    import dask.array as da

    a = da.random.default_rng(1).random((2100, 500, 600), chunks=(2100, 50, 300), dtype="float32")
    x = xr.DataArray(a, dims=("time", "lat", "lon"), name="tas")
    chunk_bytes = 2100 * 50 * 300 * 4
    given = x.memchunk.plan("std", dim="time", memory_limit="1GB", chunks={"lat": 50, "lon": 300})
    # dask computes the moments of float32 data in float64: d = x - mean and d**2, and
    # nansum's copy of d**2 (measured 7.25 x the chunk in a worker)
    assert given.predicted_task_bytes > 6.5 * chunk_bytes
    assert not given.fits
    plan = x.memchunk.plan("std", dim="time", memory_limit="1GB")
    assert plan.fits and plan.binding == "memory"
    assert np.prod([max(c) for c in plan.dask_chunks.values()]) * 4 < chunk_bytes

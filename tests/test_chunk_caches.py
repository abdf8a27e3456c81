"""The chunk caches netCDF4 keeps per variable of each open file: counted for graph inputs.

A new user's trial: ``open_mfdataset`` of 4 yearly files, ``.where(mask)`` and
``.chunk(time=100)``, a ``groupby`` planned at 99% of its budget; the worker paused in 2 of 3
runs. Its first task grew it by 228 MiB that stayed: the files' chunk caches.
"""

import gc
import math

import netCDF4
import numpy as np
import pandas as pd
import psutil
import pytest
import xarray as xr

import xarray_memchunk  # noqa: F401  (registers the accessor)
from xarray_memchunk.errors import InfeasiblePlanError
from xarray_memchunk.memory_limits import configured_baseline
from xarray_memchunk.operators.chunk_caches import held_in_chunk_caches
from xarray_memchunk.testing import watch

YEARS = (2001, 2002, 2003, 2004)
SHAPE = (365, 96, 192)
STORAGE = (183, 48, 96)
#: What an idle worker is taken to hold: the configured baseline.
IDLE = configured_baseline()
#: Bytes of the decompressed chunks of one variable in one file: 2 x 2 x 2 chunks.
CHUNKS_PER_FILE_BYTES = 8 * int(np.prod(STORAGE)) * 4


@pytest.fixture(scope="module")
def yearly(tmp_path_factory):
    """4 yearly files of tas and pr in zlib chunks of 183 x 48 x 96, and a contiguous mask."""
    root = tmp_path_factory.mktemp("yearly")
    rng = np.random.default_rng(0)
    for year in YEARS:
        data = {
            name: (("time", "lat", "lon"), rng.standard_normal(SHAPE, dtype="float32"))
            for name in ("tas", "pr")
        }
        data["sftlf"] = (("lat", "lon"), rng.uniform(0, 100, SHAPE[1:]).astype("float32"))
        ds = xr.Dataset(
            data,
            coords={
                "time": pd.date_range(f"{year}-01-01", periods=SHAPE[0], freq="D"),
                "lat": np.linspace(-89.0, 89.0, SHAPE[1]),
                "lon": np.linspace(0.0, 358.0, SHAPE[2]),
            },
        )
        chunked = {"zlib": True, "complevel": 1, "chunksizes": STORAGE}
        ds.to_netcdf(root / f"nl_{year}.nc", encoding={"tas": chunked, "pr": chunked})
    return str(root / "nl_*.nc")


def _graph(pattern: str) -> xr.Dataset:
    """The trial's graph: unit conversions and a land mask over the files, in 100-day chunks."""
    ds = xr.open_mfdataset(pattern, data_vars="minimal", coords="minimal", compat="override")
    land = ds.sftlf > 50
    graph = xr.Dataset({"tas": (ds.tas - 273.15).where(land), "pr": ds.pr * 86400})
    return graph.chunk({"time": 100, "lat": -1, "lon": -1})


def test_each_chunked_variable_of_each_file_counts_up_to_the_cache(yearly):
    graph = _graph(yearly)
    caches = held_in_chunk_caches([graph.tas, graph.pr], IDLE)
    assert caches.cache_bytes == netCDF4.get_chunk_cache()[0]
    assert (caches.files, caches.variables) == (4, 8)  # the contiguous sftlf keeps none
    assert caches.nbytes == 8 * min(CHUNKS_PER_FILE_BYTES, caches.cache_bytes)
    size, nelems, preemption = netCDF4.get_chunk_cache()
    netCDF4.set_chunk_cache(CHUNKS_PER_FILE_BYTES // 16)  # smaller than one chunk: none cached
    try:
        assert held_in_chunk_caches([graph.tas, graph.pr], IDLE).nbytes == 0
    finally:
        netCDF4.set_chunk_cache(size, nelems, preemption)


def _one_worker(memory_limit: str):
    """A LocalCluster of one 1-thread worker process, and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=1, threads_per_worker=1, memory_limit=memory_limit, dashboard_address=":0"
    )
    return cluster, Client(cluster)


def _memory_after_collecting() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


@pytest.mark.cluster
@pytest.mark.parametrize("cache", ["default", "none"])
def test_what_is_counted_is_what_a_worker_holds_while_it_reads(yearly, quiet_distributed, cache):
    graph = _graph(yearly)
    cluster, client = _one_worker("2GB")
    with cluster, client:
        if cache == "none":  # the remedy the plan's note gives
            client.run(netCDF4.set_chunk_cache, 0)
        counted = held_in_chunk_caches([graph.tas, graph.pr], IDLE).nbytes
        client.run(lambda: np.zeros(1).sum())  # the worker's first task, before measuring
        (before,) = client.run(_memory_after_collecting).values()
        outcome = watch(client, "sum", lambda: (graph.tas.sum() + graph.pr.sum()).compute())
    assert outcome.completed, outcome.error
    held = outcome.peak_bytes - before  # the caches, netCDF4's import, a file's 27 MB blocks
    if cache == "none":
        assert counted == 0 and held < 0.5 * 8 * CHUNKS_PER_FILE_BYTES, held
    else:
        assert counted == 8 * CHUNKS_PER_FILE_BYTES
        assert 0.8 * counted < held < counted + 96 * 2**20, (held, counted)  # 248-252 MiB here


def _open_and_read(pattern: str) -> None:
    """Open the files in this process, keep them open, and read every variable whole."""
    opened = xr.open_mfdataset(pattern, data_vars="minimal", coords="minimal", compat="override")
    opened.load()
    _open_and_read.kept = opened  # files open, their caches full


@pytest.mark.cluster
def test_files_a_worker_has_open_count_no_more(yearly, quiet_distributed):
    """Their caches are in the memory the worker holds now, which its budget counts."""
    graph = _graph(yearly)
    cluster, client = _one_worker("2GB")
    with cluster, client:
        assert held_in_chunk_caches([graph.tas], IDLE).nbytes == 4 * CHUNKS_PER_FILE_BYTES
        client.run(_open_and_read, yearly)
        assert held_in_chunk_caches([graph.tas, graph.pr], IDLE).nbytes == 0


@pytest.mark.cluster
def test_a_full_worker_and_a_fresh_one_are_not_both_counted(yearly, quiet_distributed):
    """A review: the baseline is the fullest worker's memory (its caches in it), and a fresh
    worker's caches were added on top. Each worker's own memory and caches are weighed."""
    from distributed import Client, LocalCluster

    graph = _graph(yearly)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="2GB") as cluster,
        Client(cluster) as client,
    ):
        full, _ = sorted(client.scheduler_info()["workers"])
        client.run(_open_and_read, yearly, workers=[full])
        (held,) = client.run(_memory_after_collecting, workers=[full]).values()
        added = held_in_chunk_caches([graph.tas, graph.pr], IDLE).nbytes
    caches = 8 * CHUNKS_PER_FILE_BYTES
    assert added < caches  # not added whole on top of the full worker's memory
    # the fresh worker's caches above what the full one holds (its memory read twice)
    assert abs(added - max(0, IDLE + caches - held)) < 8 * 2**20, (added, held)


@pytest.mark.cluster
def test_workers_in_this_process_count_the_files_it_opened(yearly, quiet_distributed):
    """A review: they share this process's open files, opened for metadata with empty
    caches, and counted none."""
    from distributed import Client, LocalCluster

    graph = _graph(yearly)
    with (
        LocalCluster(n_workers=1, processes=False, memory_limit="2GB") as cluster,
        Client(cluster),
    ):
        caches = held_in_chunk_caches([graph.tas, graph.pr], 0)
        note = next(
            n
            for n in graph.memchunk.plan("std", dim="time").notes
            if n.startswith("netCDF chunk caches")
        )
    assert caches.nbytes >= 8 * CHUNKS_PER_FILE_BYTES
    # the files open in this process: a client.run there would change no cache of theirs
    assert "netCDF4.set_chunk_cache(0) before opening the files" in note
    assert "client.run" not in note


def test_with_no_cluster_the_note_and_refusal_say_how_this_process_keeps_none(yearly, threaded):
    # a new user's trial was told to call client.run(...) where there was no client
    graph = _graph(yearly)
    plan = graph.memchunk.plan("std", dim="time", memory_limit="4GB")
    note = next(n for n in plan.notes if n.startswith("netCDF chunk caches"))
    assert "this process keeps" in note and "netCDF4.set_chunk_cache(0)" in note
    assert "client" not in note
    with pytest.raises(InfeasiblePlanError) as refused:
        graph.memchunk.plan("std", dim="time", memory_limit="400MB")
    assert "netCDF4.set_chunk_cache(0) before opening the files" in str(refused.value)
    assert "client.run" not in str(refused.value)


def test_a_budget_given_by_hand_gets_no_note_of_what_it_does_not_count(yearly):
    from xarray_memchunk import Budget

    given = Budget(
        worker_memory=2 * 10**9,
        threads_per_worker=1,
        n_workers=1,
        per_task=400 * 2**20,
        source="by hand",
    )
    plan = _graph(yearly).memchunk.plan("std", dim="time", budget=given)
    assert plan.budget.per_task == given.per_task
    assert not any("netCDF chunk caches" in note for note in plan.notes)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_graph_over_netcdf_files_is_refused_where_their_caches_leave_no_room(
    yearly, quiet_distributed
):
    """Planned before with 38% of its budget, the run paused its 520 MB worker twice (its
    caches took 206 MiB). Now refused, with the least memory_limit; there it runs unpaused."""
    graph = _graph(yearly)
    cluster, client = _one_worker("520MB")
    with cluster, client, pytest.raises(InfeasiblePlanError) as refused:
        graph.memchunk.plan("std", dim="time")
    assert "netCDF chunk caches (205.88 MiB)" in str(refused.value)
    assert "client.run(netCDF4.set_chunk_cache, 0)" in str(refused.value)
    least = refused.value.minimum_memory_limit
    cluster, client = _one_worker(f"{math.ceil(least / 1e6)}MB")
    with cluster, client:
        plan = graph.memchunk.plan("std", dim="time")
        assert plan.budget.worker_baseline >= configured_baseline() + 8 * CHUNKS_PER_FILE_BYTES
        assert any("netCDF chunk caches" in note for note in plan.notes)
        outcome = watch(client, "std", lambda: plan.apply().compute())
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0

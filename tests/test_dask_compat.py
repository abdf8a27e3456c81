"""Every private Dask and distributed API the package relies on, against the installed versions.

Each test exercises one function of :mod:`xarray_memchunk._dask_compat` on real objects (small
arrays, files opened by xarray, an in-process cluster), so that an upgrade of Dask, distributed
or xarray that breaks one of its assumptions fails here first.
"""

import logging
import subprocess
import sys
import types
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from dask.highlevelgraph import HighLevelGraph

from xarray_memchunk import _dask_compat as compat


class ArrayLike:
    """A minimal array-like object that ``from_array`` keeps as it is (not a NumPy array)."""

    def __init__(self, values: np.ndarray):
        self.values = values
        self.shape = values.shape
        self.dtype = values.dtype
        self.ndim = values.ndim

    def __getitem__(self, key):
        return self.values[key]


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """A small variable written to netCDF and to Zarr, and two netCDF files along time."""
    root = tmp_path_factory.mktemp("compat")
    values = np.arange(6 * 4 * 5, dtype="float32").reshape(6, 4, 5)
    ds = xr.Dataset({"v": (("t", "y", "x"), values)})
    ds.to_netcdf(root / "v.nc", engine="netcdf4")
    ds.isel(t=slice(0, 3)).to_netcdf(root / "a.nc", engine="netcdf4")
    ds.isel(t=slice(3, 6)).to_netcdf(root / "b.nc", engine="netcdf4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Zarr v3's consolidated metadata warning
        ds.to_zarr(root / "v.zarr")
        zarr = xr.open_zarr(root / "v.zarr", chunks={"t": 2})
    netcdf = xr.open_dataset(root / "v.nc", chunks={"t": 2})
    several = xr.open_mfdataset(
        [root / "a.nc", root / "b.nc"], combine="nested", concat_dim="t", chunks={"t": 3}
    )
    yield {"values": values, "zarr": zarr, "netcdf": netcdf, "several": several}
    for ds in (zarr, netcdf, several):
        ds.close()


def _backend(array):
    """xarray's backend array under its lazily indexed wrappers, or None."""
    from xarray.backends.common import BackendArray

    while array is not None and not isinstance(array, BackendArray):
        array = getattr(array, "array", None)
    return array


# --- task graphs ------------------------------------------------------------------------------


def test_graph_layers_and_dependencies_of_an_array():
    x = da.ones((4, 6), chunks=2)
    y = x + 1
    layers = compat.graph_layers(y)
    assert set(layers) == {x.name, y.name}
    assert compat.graph_layers(y.__dask_graph__()).keys() == layers.keys()
    assert compat.high_level_graph(y) is y.__dask_graph__()
    assert compat.layer_dependencies(y.__dask_graph__(), y.name) == {x.name}
    assert compat.layer_dependencies(y.__dask_graph__(), x.name) == set()
    tasks = compat.layer_tasks(y.__dask_graph__(), y.name)
    assert set(tasks) == {(y.name, i, j) for i in range(2) for j in range(3)}
    # an xarray object holds the same graph
    assert set(compat.graph_layers(xr.DataArray(y, dims=("a", "b")))) == set(layers)


def test_graph_layers_of_anything_else_are_empty():
    assert compat.graph_layers(np.ones(3)) == {}
    assert compat.graph_layers({("x", 0): 1}) == {}
    assert compat.high_level_graph({("x", 0): 1}) is None
    assert compat.high_level_graph(xr.DataArray(np.ones(3))) is None


def test_first_task_arguments_find_an_inlined_array():
    source = ArrayLike(np.arange(12.0).reshape(3, 4))
    x = da.from_array(source, chunks=(1, 4), name="memchunk-read-test", inline_array=True)
    assert list(compat.graph_layers(x)) == ["memchunk-read-test"]
    args = compat.first_task_arguments(x.__dask_graph__(), x.name)
    assert any(a is source for a in args)
    assert compat.task_data(7) == 7


@pytest.mark.parametrize("kind", ["zarr", "netcdf"])
def test_from_array_source_finds_the_file_behind_an_opened_variable(opened, kind):
    data = opened[kind].v.data
    graph = data.__dask_graph__()
    assert len(compat.graph_layers(data)) == 2
    (original,) = compat.layer_dependencies(graph, data.name)
    assert str(original).startswith(compat.FROM_ARRAY_PREFIX)
    source = compat.from_array_source(graph, data.name)
    assert source is not None and not isinstance(source, np.ndarray)
    assert _backend(source) is not None
    assert tuple(source.shape) == data.shape
    np.testing.assert_array_equal(
        np.asarray(source[(slice(1, 3),) * 3]), opened["values"][1:3, 1:3, 1:3]
    )


def test_from_array_source_is_none_for_other_graphs(opened):
    computed = opened["zarr"].v.data + 1
    assert compat.from_array_source(computed.__dask_graph__(), computed.name) is None
    x = da.ones((4,), chunks=2)
    assert compat.from_array_source(x.__dask_graph__(), x.name) is None


def test_alias_target_follows_a_concatenation_of_files(opened):
    data = opened["several"].v.data
    graph = data.__dask_graph__()
    parts = compat.layer_dependencies(graph, data.name)
    assert len(parts) == 2
    assert len(compat.graph_layers(graph)) == 1 + 2 * len(parts)
    targets = {
        key[1:]: compat.alias_target(value)
        for key, value in compat.layer_tasks(graph, data.name).items()
    }
    assert {t[0] for t in targets.values()} == parts
    assert all(isinstance(t, tuple) for t in targets.values())
    for part in parts:  # each part is one file's getters of its own ``original-`` layer
        assert _backend(compat.from_array_source(graph, part)) is not None
    assert compat.alias_target(("x", 0)) == ("x", 0)


def test_file_backend_recognizes_files_through_the_compat_functions(opened):
    from xarray_memchunk.operators.sources import ConcatenatedReads, file_backend

    assert file_backend(opened["zarr"].v.data) is not None
    assert file_backend(opened["netcdf"].v.data) is not None
    assert isinstance(file_backend(opened["several"].v.data), ConcatenatedReads)
    assert file_backend((opened["zarr"].v + 1).data) is None


def test_array_meta_is_an_empty_block():
    x = da.ones((4, 6), chunks=2, dtype="float32")
    meta = compat.array_meta(x)
    assert isinstance(meta, np.ndarray) and meta.size == 0 and meta.dtype == np.float32
    values = np.ones(3)
    assert compat.array_meta(values) is values


def test_ensure_minimum_chunksize_merges_short_chunks():
    merged = compat.ensure_minimum_chunksize(3, (5, 1, 5))
    assert sum(merged) == 11 and min(merged) >= 3
    assert compat.ensure_minimum_chunksize(2, (4, 4)) == (4, 4)
    with pytest.raises(ValueError):
        compat.ensure_minimum_chunksize(10, (2, 3))


def test_task_spec_copies_a_graph_under_new_keys():
    """What ``produced_again`` does with dask's Task nodes: cull, rename, wait for a key."""
    from dask.core import flatten

    assert all(callable(getattr(compat, name)) for name in compat.TASK_SPEC_NAMES)
    x = da.arange(6, chunks=3) * 2
    unused = da.ones(2, chunks=1)
    legacy = dict(HighLevelGraph.merge(x.__dask_graph__(), unused.__dask_graph__()))
    graph = compat.cull(compat.convert_legacy_graph(legacy), list(flatten(x.__dask_keys__())))
    assert set(graph) == set(dict(x.__dask_graph__()))  # the unused array is culled
    renamed = {key: (f"copy-{key[0]}", *key[1:]) for key in graph}
    copied = {}
    for key, new in renamed.items():
        node = graph[key].substitute(renamed, key=new)
        assert set(node.dependencies) <= set(renamed.values())
        copied[new] = node
    roots = [k for k, n in copied.items() if not n.dependencies]
    assert roots
    gate = ("gate",)
    waiting = compat.Task(
        ("waits",), lambda value, _: value, compat.TaskRef(roots[0]), compat.TaskRef(gate)
    )
    assert set(waiting.dependencies) == {roots[0], gate}
    copied[gate] = compat.Task(gate, int, 0)
    copied[("waits",)] = waiting
    result = dask.get(copied, [(f"copy-{x.name}", i) for i in range(2)])
    np.testing.assert_array_equal(np.concatenate(result), np.arange(6) * 2)


def _gathers(result, source):
    return compat.neighbour_gathering_layers(result, compat.graph_layers(source))


def test_neighbour_gathering_layers_of_dask_and_xarray_stencils():
    x = da.ones((8, 8), chunks=4)
    assert _gathers(x.map_overlap(lambda b: b, depth=1, boundary="none"), x)
    assert _gathers(x.map_overlap(lambda b: b, depth=1, boundary="reflect"), x)
    assert _gathers(da.overlap.overlap(x, depth={0: 1, 1: 1}, boundary="none"), x)
    assert _gathers(da.lib.stride_tricks.sliding_window_view(x, (3, 3)), x)
    arr = xr.DataArray(x, dims=("a", "b"))
    assert _gathers(arr.rolling(a=3).mean(), x)
    assert _gathers(arr.rolling(a=3, center=True).construct("w"), x)
    assert _gathers(arr.differentiate("a"), x)
    # as a Dataset, whose graph merges its variables'
    assert _gathers(arr.rolling(a=3).mean().to_dataset(name="v"), x)


def test_neighbour_gathering_layers_ignore_blockwise_work_and_other_inputs():
    x = da.ones((8, 8), chunks=4)
    assert _gathers(x.map_blocks(lambda b: b + 1) * 2, x) == []
    assert _gathers(x.sum(axis=0), x) == []
    other = da.zeros((8, 8), chunks=4)
    both = x + other.map_overlap(lambda b: b, depth=1, boundary="none")
    assert _gathers(both, x) == []  # the halos gathered are the other array's
    assert _gathers(both, other)
    assert compat.neighbour_gathering_layers(np.ones(3), ["x"]) == []


def test_map_blocks_with_halo_on_a_file_gathers_nothing(opened):
    from xarray_memchunk.operators.sources import map_blocks_with_halo, read_chunked

    v = read_chunked(opened["zarr"].v, {"t": (3, 3), "y": (2, 2), "x": (5,)})
    result = map_blocks_with_halo(v.data, lambda b: b, {0: 1, 1: 1}, "float32")
    assert _gathers(result, v.data) == []
    np.testing.assert_array_equal(result.compute(scheduler="synchronous"), opened["values"])
    overlapped = v.data.map_overlap(lambda b: b, depth={0: 1, 1: 1}, boundary="none")
    assert _gathers(overlapped, v.data)


# --- workers, clusters, the scheduler ---------------------------------------------------------


@pytest.fixture(scope="module")
def local():
    """An in-process cluster of one worker of two threads, and its client."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def _on_worker(func):
    """``func(worker)`` as ``client.run`` calls a function with the worker it runs on."""

    def run(dask_worker):
        return func(dask_worker)

    return run


@pytest.mark.cluster
def test_worker_threads_stored_bytes_and_device_limit(local):
    _, client = local
    (threads,) = client.run(_on_worker(compat.worker_threads)).values()
    assert threads == 2
    (before,) = client.run(_on_worker(compat.worker_stored_bytes)).values()
    held = client.submit(np.ones, 2**20, pure=False)  # 8 MiB kept in the worker
    held.result()
    (after,) = client.run(_on_worker(compat.worker_stored_bytes)).values()
    assert after - before >= 8 * 2**20
    del held
    (limit,) = client.run(_on_worker(compat.worker_device_memory_limit)).values()
    assert limit is None  # a worker without dask-cuda


@pytest.mark.cluster
def test_bounded_runs_answer_and_give_up_on_a_silent_worker_or_scheduler(local):
    import asyncio
    import time

    _, client = local
    (address,) = client.scheduler_info()["workers"]
    assert compat.bounded_run(client, lambda: 7, [address], 5.0) == {address: 7}

    async def silent(**_):  # a worker or scheduler that accepts the call and never answers
        await asyncio.sleep(30)

    for ask in (
        lambda: compat.bounded_run(client, silent, [address], 0.5),
        lambda: compat.bounded_run_on_scheduler(client, silent, 0.5),
    ):
        start = time.perf_counter()
        with pytest.raises(TimeoutError):
            ask()
        assert time.perf_counter() - start < 5  # not the 30 s the call would wait
    assert compat.bounded_run_on_scheduler(client, lambda dask_scheduler: 3, 5.0) == 3


@pytest.mark.cluster
def test_worker_plugin_finds_a_registered_plugin(local):
    from distributed.diagnostics.plugin import WorkerPlugin

    _, client = local

    class Marker(WorkerPlugin):
        name = "memchunk-compat-marker"

    client.register_plugin(Marker(), name=Marker.name)

    def found(dask_worker):
        return type(compat.worker_plugin(dask_worker, Marker.name)).__name__

    assert list(client.run(found).values()) == ["Marker"]
    assert compat.worker_plugin(None, Marker.name) is None
    client.unregister_worker_plugin(Marker.name)


@pytest.mark.cluster
def test_pause_and_removal_events(local):
    import time

    from distributed.core import Status

    cluster, client = local
    since = time.time()

    def pause(dask_worker):
        dask_worker.status = Status.paused
        dask_worker.status = Status.running

    client.run(pause)
    cluster.scale(2)
    client.wait_for_workers(2)
    (first,) = client.run(lambda: 1, workers=[cluster.workers[0].address])
    retired = next(iter(client.retire_workers(workers=[first]).keys()), first)

    def events():
        return [
            (topic, msg)
            for topic, entries in client.get_events().items()
            for stamp, msg in entries
            if stamp >= since
        ]

    deadline = time.time() + 10
    while time.time() < deadline:
        removals = [r for t, m in events() if (r := compat.worker_removal(t, m)) is not None]
        if removals:
            break
        time.sleep(0.1)
    assert any(compat.is_pause_event(m) for _, m in events())
    assert not compat.is_pause_event("paused")
    assert [r.worker for r in removals] == [retired]
    assert removals[0].expected is True
    assert isinstance(removals[0].processing, tuple)
    assert compat.worker_removal("all", {"action": "add-worker"}) is None
    cluster.scale(1)


def test_memory_restart_event_of_the_nanny():
    """The nanny's memory monitor, on a process above its limit, logs what we read."""
    from distributed.core import Status
    from distributed.worker_memory import NannyMemoryManager

    logged = []
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        nanny = types.SimpleNamespace(
            nthreads=1,
            periodic_callbacks={},
            status=Status.running,
            process=types.SimpleNamespace(process=process),
            worker_address="tcp://127.0.0.1:1234",
            log_event=lambda topic, msg: logged.append((topic, msg)),
        )
        manager = NannyMemoryManager(nanny, memory_limit=1024)
        logging.getLogger("distributed.nanny").disabled = True
        try:
            manager.memory_monitor(nanny)
        finally:
            logging.getLogger("distributed.nanny").disabled = False
        process.wait(timeout=10)  # terminated by the monitor
    finally:
        process.kill()
    ((topic, msg),) = logged
    assert topic == compat.MEMORY_RESTART_TOPIC
    assert compat.memory_restart(topic, msg) == "tcp://127.0.0.1:1234"
    assert compat.memory_restart("all", msg) is None


def _threads_here(n_workers: int):
    """A quiet ``LocalCluster`` of ``n_workers`` one-thread workers in this process."""
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=False,
        dashboard_address=":0",
        silence_logs=logging.CRITICAL,
    )


@pytest.mark.cluster
def test_adaptive_bounds_of_a_cluster():
    with _threads_here(1) as cluster:
        assert compat.adaptive_bounds(cluster) is None
        adaptive = cluster.adapt(minimum=1, maximum=1)
        assert compat.adaptive_bounds(cluster) == (1, 1)
        adaptive.stop()
        assert compat.adaptive_bounds(cluster) is None
        cluster.adapt(minimum=1)
        assert compat.adaptive_bounds(cluster) == (1, float("inf"))
    assert compat.adaptive_bounds(None) is None


@pytest.mark.cluster
def test_workers_in_this_process_are_the_open_ones():
    with _threads_here(2) as cluster:
        own = set(cluster.scheduler_info["workers"])
        assert len(own) == 2
        assert own <= {w.address for w in compat.workers_in_this_process()}
    assert not own & {w.address for w in compat.workers_in_this_process()}


def test_worker_memory_limit_reads_limits_as_a_worker():
    import psutil

    machine = compat.worker_memory_limit(1.0, 1)  # a fraction of 1: all the machine's memory
    assert 0 < machine <= psutil.virtual_memory().total
    assert compat.worker_memory_limit("100MB", 1) == 100_000_000
    assert compat.worker_memory_limit(2**20, 1) == 2**20
    assert compat.worker_memory_limit(0, 1) is None
    assert compat.worker_memory_limit(None, 1) is None
    assert abs(compat.worker_memory_limit(0.5, 1) - machine / 2) <= 1
    # "auto": the machine's memory shared by threads
    assert abs(compat.worker_memory_limit("auto", 1, 4) - machine / 4) <= 1
    assert compat.worker_memory_limit("auto", 4, 4) == machine
    assert compat.worker_memory_limit(10 * machine, 1) == machine  # capped


def test_check_scheduler_address():
    for address in ("tcp://127.0.0.1:8786", "127.0.0.1:8786", "inproc://10.0.0.1/1/2"):
        compat.check_scheduler_address(address)
    for address in ("nonsense://host:1", "tcp://127.0.0.1"):
        with pytest.raises(ValueError):
            compat.check_scheduler_address(address)


@pytest.mark.cluster
def test_periodic_progress_reports_to_the_end(local):
    _, client = local
    reports = []
    future = client.compute(da.ones((40,), chunks=4).sum())
    compat.periodic_progress([future], lambda *r: reports.append(r), every_s=0.0, interval="50ms")
    assert reports and reports[-1][0] == 1.0
    assert all(n >= 1 and seconds >= 0 for _, n, seconds in reports)
    assert future.result() == 40

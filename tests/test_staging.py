"""Rechunking through disk where memory cannot (issue 28, item 2)."""

import re
import shutil
from collections import namedtuple

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.operators import staging
from xarray_memchunk.operators.sources import read_chunked


def _local_cluster(n_workers: int, threads_per_worker: int):
    """A ``LocalCluster`` of workers of 0.5 GB on this machine's loopback."""
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        memory_limit="0.5GB",
        host="127.0.0.1",
        dashboard_address=":0",
    )


def time_chunked(shape=(600, 200, 200), chunks=(50, 200, 200)):
    data = da.random.default_rng(3).random(shape, chunks=chunks, dtype="float64")
    return xr.DataArray(data, dims=("time", "y", "x"), name="t")


def test_a_rechunk_that_memory_cannot_hold_is_staged_on_disk():
    plan = time_chunked().memchunk.plan("median", dim="time", memory_limit="0.5GB")
    note = next(n for n in plan.notes if "temporary Zarr store" in n)
    assert re.search(r"disk measured at [\d.]+ (kiB|MiB|GiB)/s", note)  # the disk was measured
    assert plan.predicted_peak_bytes <= plan.budget.per_task
    # the storage row says whose chunks it shows: the store's, not the input's own (time: 50)
    storage = next(line for line in plan.explain().splitlines() if line.startswith("storage"))
    assert "the chunks of the temporary Zarr store apply stages the data in first" in storage
    # with memory to spare, nothing is written
    roomy = time_chunked().memchunk.plan("median", dim="time", memory_limit="0.9GB")
    assert not any("temporary Zarr store" in n for n in roomy.notes)
    storage = next(line for line in roomy.explain().splitlines() if line.startswith("storage"))
    assert "the input's storage chunks" in storage


def test_measure_never_stages_without_writing_to_measure_the_disk(monkeypatch, tmp_path):
    def probe(directory):
        raise AssertionError(f"the disk at {directory} was measured")

    monkeypatch.setattr(staging, "disk_bandwidth", probe)
    with dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}):
        plan = time_chunked().memchunk.plan(
            "median", dim="time", memory_limit="0.5GB", measure="never"
        )
    note = next(n for n in plan.notes if "temporary Zarr store" in n)
    assert "disk speed not measured" in note
    assert any("staging disk's speed not measured" in n for n in plan.notes)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_staging_is_refused_without_room_on_disk(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        pytest.raises(
            xm.InfeasiblePlanError,
            match=r"To run it unstaged, .*Nor can it be staged in a temporary Zarr.*0\.98 kiB free",
        ),
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


def test_the_staged_store_is_not_compressed(tmp_path, threaded):
    """Written once and read back once: compressing it cost more than it saved (a staged
    quantile of a 1.21 GB store took 10.6 s uncompressed, 13.2 s with zstd)."""
    import zarr

    array = time_chunked((60, 40, 40), (10, 40, 40))
    site = staging.StagingSite(tmp_path, 10**9, 0.0)
    staged = staging.stage(array, site)
    (store,) = tmp_path.glob("memchunk-staged-*.zarr")
    assert not zarr.open_array(store / "t", mode="r").compressors
    np.testing.assert_array_equal(staged.values, array.values)


def test_a_file_is_staged_by_write_tasks_that_read_their_chunks(tmp_path, threaded, monkeypatch):
    """No task per source chunk and no merge: staging the 1.85 GB peers cube (one-day chunks)
    took 30.6 s through a task per day and 10.2 s so (2 workers x 1 thread)."""
    daily = np.random.default_rng(4).random((90, 12, 20)).astype("float32")
    xr.Dataset({"tas": (("time", "lat", "lon"), daily)}).to_zarr(
        tmp_path / "daily.zarr", encoding={"tas": {"chunks": (1, 12, 20)}}
    )
    tas = xr.open_zarr(tmp_path / "daily.zarr")["tas"]
    read = []
    monkeypatch.setattr(
        staging,
        "read_chunked",
        lambda da, chunks, *rest: read.append(chunks) or read_chunked(da, chunks, *rest),
    )
    chunks = staging.StagingChunks(
        store={"time": 40, "lat": 12, "lon": 5},
        write={"time": 40, "lat": 12, "lon": 20},
        source={"time": 1, "lat": 12, "lon": 20},
    )
    site = staging.StagingSite(tmp_path, 10**9, 0.0)
    staged = staging.stage(tas, site, chunks)
    assert read == [{"time": (40, 40, 10), "lat": (12,), "lon": (20,)}]
    assert staged.chunks == ((40, 40, 10), (12,), (5, 5, 5, 5))
    np.testing.assert_array_equal(staged.values, daily)
    graph = time_chunked((60, 40, 40), (10, 40, 40))  # not a file: merged in the graph
    np.testing.assert_array_equal(staging.stage(graph, site).values, graph.values)
    assert len(read) == 1


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


def test_staging_chunks_cut_source_chunks_to_the_plan_and_merge_thin_ones():
    source = {"time": 1, "plev": 4, "lat": 180, "lon": 360}
    planned = {"time": 3650, "plev": 4, "lat": 90, "lon": 28}
    budget = 565 * 2**20
    chunks = staging.staging_chunks(source, planned, 8, budget)
    # cut: the largest divisor of the source chunk within the planned one (360 -> 24, not 28)
    assert chunks.store == {"time": 57, "plev": 4, "lat": 90, "lon": 24}
    # merged: as many one-step chunks per write task as its memory allows (a merge holds them)
    assert chunks.write == {"time": 57, "plev": 4, "lat": 180, "lon": 360}
    assert chunks.merged
    copies = staging.WRITE_COPIES + staging.MERGE_COPIES
    assert chunks.task_bytes(8) == copies * chunks.write_bytes(8) <= budget
    assert chunks.task_bytes(8) * 58 / 57 > budget
    # merged no further than the planned chunk
    short = staging.staging_chunks(source, {**planned, "time": 40}, 8, budget)
    assert short.store["time"] == short.write["time"] == 40
    # where one more source chunk would not fit, none is merged
    single = staging.staging_chunks(source, planned, 8, copies * 1.9 * 8 * 4 * 180 * 360)
    assert single.write["time"] == 1 and not single.merged


def test_staging_chunks_where_the_planned_chunk_has_no_near_divisor():
    # 181 is prime: pieces of one row would be 8 kB files; the source's 181 rows are kept
    kept = staging.staging_chunks({"time": 1000, "lat": 181}, {"time": 1000, "lat": 90}, 8, 1e9)
    assert kept.store == {"time": 1000, "lat": 181}
    # a source chunk that spans the whole dim is whole in store chunks of any length: the plan's
    sizes = {"time": 4000, "lat": 181}
    whole = staging.staging_chunks(
        {"time": 1000, "lat": 181}, {"time": 1000, "lat": 90}, 8, 1e9, sizes=sizes
    )
    assert whole.store == {"time": 1000, "lat": 90}
    assert whole.write == {"time": 1000, "lat": 181}
    # rows of 1.6 MB each are worth a file: cut to the divisor, 1
    cut = staging.staging_chunks(
        {"time": 200_000, "lat": 181}, {"time": 200_000, "lat": 90}, 8, 1e12
    )
    assert cut.store == {"time": 200_000, "lat": 1}


def test_a_thin_block_is_not_stored_in_a_chunk_many_times_longer():
    # a one-day-chunked store's monthly means, whole time, in blocks of 3 of 173 latitudes
    # (prime): a store chunk of all 173 would decode 58 times each block's bytes, 154 times
    # over the run (trial 451); rows of one latitude cost a file each, far less
    source, planned = {"time": 66, "lat": 173, "lon": 346}, {"time": 4573, "lat": 3, "lon": 173}
    chunks = staging.staging_chunks(source, planned, 8, 115e6)
    assert chunks.store == {"time": 66, "lat": 1, "lon": 173}
    per_element = 8 * 66 * 173
    assert staging.block_read_bytes(1, 3, per_element) < staging.block_read_bytes(
        173, 3, per_element
    )
    # knowing that lat is one source chunk, the store chunk is the planned block
    sizes = {"time": 4573, "lat": 173, "lon": 346}
    assert staging.staging_chunks(source, planned, 8, 115e6, sizes=sizes).store["lat"] == 3


def test_a_store_chunk_is_weighed_at_its_merged_length():
    # one-step chunks merged 4000 to a write: rows of one latitude are 11 MB, not 2.7 kB, and
    # worth their files; all 173 would decode 58 times each block
    source, planned = {"time": 1, "lat": 173, "lon": 346}, {"time": 4000, "lat": 3, "lon": 173}
    chunks = staging.staging_chunks(source, planned, 8, 1e10)
    assert chunks.store == {"time": 4000, "lat": 1, "lon": 173}


def test_a_block_spans_store_chunks_as_their_offsets_allow():
    # aligned: a block of 28 over chunks of 7 spans 4, and wrote 4; of 56, one, and half of one
    file = staging.CHUNK_FILE_BYTES
    assert staging.block_read_bytes(7, 28, 0) == 4 * file + 4 * file
    assert staging.block_read_bytes(56, 28, 0) == file + file / 2
    # blocks of 28 start at 0, 4, 8, ... 20 within chunks of 24: 2 chunks each on average
    assert staging.block_read_bytes(24, 28, 1.0) == 2 * (file + 24) + 28 / 24 * file


def test_staging_chunks_are_cut_where_reading_them_would_not_fit():
    source = {"time": 1, "plev": 4, "lat": 180, "lon": 360}
    planned = {"time": 3650, "plev": 4, "lat": 90, "lon": 24}
    chunks = staging.staging_chunks(
        source, planned, 8, 565 * 2**20, reads_fit=lambda store: store["time"] <= 40
    )
    # the store's chunks as long as reads allow; each write task still writes whole ones
    assert 20 <= chunks.store["time"] <= 40
    assert chunks.write["time"] % chunks.store["time"] == 0
    assert chunks.write["time"] >= 2 * chunks.store["time"]


@pytest.mark.cluster
def test_one_step_chunks_are_staged_in_chunks_for_the_plan(tmp_path, quiet_distributed):
    # a climate cube in one-step chunks, its median over time in blocks that cut lat and lon:
    # stored as it comes, each block's read would decode the whole store
    import zarr
    from distributed import Client

    from xarray_memchunk.testing import run_watched

    data = xr.DataArray(
        da.random.default_rng(4).random((730, 2, 90, 180), chunks=(1, 2, 90, 180)),
        dims=("time", "plev", "lat", "lon"),
        name="t",
    )
    with dask.config.set(scheduler="threads"):
        expected = data.median("time").values
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        _local_cluster(n_workers=2, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        plan = data.memchunk.plan("median", dim="time")
        assert any("temporary Zarr store" in n for n in plan.notes)
        result = {}

        def run():
            lazy = data.memchunk.apply("median", dim="time")
            result["median"] = lazy
            return lazy.data

        outcome = run_watched(client, "staged in the plan's chunks", run)
        assert outcome.completed, outcome.error
        assert outcome.pauses == 0 and outcome.worker_deaths == 0
        np.testing.assert_allclose(result["median"].values, expected)
    (path,) = tmp_path.glob("memchunk-staged-*.zarr")
    stored = zarr.open_group(path, mode="r")["t"].chunks
    planned = plan.chunks
    assert stored != (1, 2, 90, 180)
    # whole time steps merged, lat and lon cut to pieces within the planned blocks
    assert stored[0] > 1
    assert stored[2] <= planned["lat"] and 90 % stored[2] == 0
    assert stored[3] <= planned["lon"] and 180 % stored[3] == 0
    assert dict(zip(data.dims, stored, strict=True)) == plan.storage_chunks


def _resident_trimmed() -> int:
    """This process's resident memory, after a collection and the allocator's trim."""
    import psutil

    from xarray_memchunk.models.profiling import release_freed_memory

    release_freed_memory()
    return psutil.Process().memory_info().rss


@pytest.mark.cluster
@pytest.mark.slow
def test_a_staged_plan_counts_what_writing_many_source_chunks_leaves_in_a_worker(
    tmp_path, quiet_distributed
):
    """Trial 159 of seed 2027, a monthly climatology of a graph in 6449 one-day chunks staged on
    1 worker x 2 threads at 0.5 GB, started its reads with the worker 38 MiB above its plan's
    baseline, and paused it 3 times: writing the source chunks had left 89 MiB there."""
    from distributed import Client

    from xarray_memchunk.operators.staged_plan import STAGING_KEPT_POWER, STAGING_KEPT_SCALE

    data = xr.DataArray(
        da.random.default_rng(5).standard_normal((3000, 57, 114), chunks=(1, 57, 114)),
        dims=("time", "lat", "lon"),
        name="t",
    ).astype("float32")
    with (
        dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}),
        _local_cluster(n_workers=1, threads_per_worker=2) as cluster,
        Client(cluster) as client,
    ):
        plan = data.memchunk.plan("median", dim="time")
        assert any("temporary Zarr store" in n for n in plan.notes)
        (before,) = client.run(_resident_trimmed).values()
        plan.apply()  # writes the store
        (after,) = client.run(_resident_trimmed).values()
    source = plan.budget.baseline_source
    counted = float(source.split(" MiB more after staging the data")[0].split()[-1]) * 2**20
    # 3000 source chunks, all written by the one worker
    assert counted == pytest.approx(STAGING_KEPT_SCALE * 3000**STAGING_KEPT_POWER, abs=2**14)
    assert after - before <= counted, (after - before) / 2**20


class _Scheduler:
    """A client whose scheduler lists workers at the given addresses (no cluster object)."""

    cluster = None

    def __init__(self, *addresses):
        self.addresses = addresses

    def scheduler_info(self):
        return {"workers": {address: {} for address in self.addresses}}


def test_dask_workers_started_on_this_machine_stage_in_its_temporary_directory():
    # `dask scheduler` + `dask worker` started here, as HPC users start them: no LocalCluster
    here = _Scheduler("tcp://127.0.0.1:40001", "tcp://localhost:40002")
    assert staging.staging_site(10**6, here, measure_bandwidth=False).refusal == ""
    elsewhere = _Scheduler("tcp://127.0.0.1:40001", "tcp://192.0.2.7:40002")  # TEST-NET-1
    assert "share" in staging.staging_site(10**6, elsewhere, measure_bandwidth=False).refusal
    assert "share" in staging.staging_site(10**6, _Scheduler(), measure_bandwidth=False).refusal


_QUIET = {"dashboard_address": ":0"}


@pytest.mark.skipif(not staging.SHARED_MEMORY.is_dir(), reason="no /dev/shm on this system")
def test_data_that_fit_beyond_the_workers_limits_are_staged_in_memory(tmp_path, monkeypatch):
    import psutil
    from distributed import Client, LocalCluster

    # the machine's available memory and the stores other processes staged are held still:
    # other tests running beside this one move them (it failed once in a full run on 2 cores)
    machine = psutil.virtual_memory()
    still = machine._replace(available=min(machine.available, 16 * 10**9))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: still)
    monkeypatch.setattr(staging, "staged_bytes", lambda directory: 0)
    # the worker runs in this process and pauses on all it holds: at 1 GB, a test process
    # past 800 MB (late in a full run) paused it, and the staged read below waited for ever
    limit = psutil.Process().memory_info().rss + 10**9
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, memory_limit=limit, **_QUIET
        ) as c,
        Client(c) as client,
    ):
        site = staging.staging_site(10**6, client, measure_bandwidth=False)
        assert site.in_memory and site.directory == staging.SHARED_MEMORY
        assert "memory beyond the workers' limits" in site.where
        # more than half of what the workers' limits leave: on disk
        left = still.available - limit
        disk = staging.staging_site(int(0.9 * left), client, measure_bandwidth=False)
        assert not disk.in_memory and disk.directory != staging.SHARED_MEMORY
        # a directory the user names is used as it is
        with dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path)}):
            named = staging.staging_site(10**6, client, measure_bandwidth=False)
        assert named.directory == tmp_path and not named.in_memory
        c.adapt(minimum=1)  # no maximum: workers' limits without bound
        assert not staging.staging_site(10**6, client, measure_bandwidth=False).in_memory
        # a directory dask is told to use for temporary files is used as it is
        with dask.config.set({"temporary-directory": str(tmp_path)}):
            assert (
                staging.staging_site(10**6, client, measure_bandwidth=False).directory == tmp_path
            )
        # memory the stores already there take is not given again
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(staging, "staged_bytes", lambda directory: int(0.6 * left))
            assert staging.memory_directory(10**6, client) is None
        # a cgroup or rlimit below the machine's memory: the host's free memory is not ours
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("distributed.system.MEMORY_LIMIT", psutil.virtual_memory().total // 2)
            assert staging.memory_directory(10**6, client) is None
        # memory that filled since the plan: the data go to the disk instead
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(staging, "memory_directory", lambda nbytes, client: None)
            (tmp_path / "disk").mkdir()
            patch.setattr(staging.tempfile, "gettempdir", lambda: str(tmp_path / "disk"))
            data = xr.DataArray(np.arange(24.0).reshape(4, 6), dims=("t", "x"), name="v")
            staged = staging.stage(data.chunk({"t": 2}), site)
            assert list((tmp_path / "disk").glob(f"{staging.STORE_PREFIX}*.zarr"))
            np.testing.assert_array_equal(staged.values, data.values)
    # no cluster (threads), or workers without a limit: on disk
    assert not staging.staging_site(10**6, None, measure_bandwidth=False).in_memory
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, memory_limit=0, **_QUIET
        ) as c,
        Client(c) as client,
    ):
        assert not staging.staging_site(10**6, client, measure_bandwidth=False).in_memory


def test_a_first_dim_merged_alone_is_stored_in_planned_chunks_written_in_slabs():
    source = {"time": 1, "lat": 288, "lon": 720}
    planned = {"time": 2920, "lat": 288, "lon": 72}
    sizes = {"time": 2920, "lat": 288, "lon": 720}
    slabs = staging.staging_chunks(source, planned, 4, 514e6, None, sizes, slabs=True)
    assert slabs.store == planned  # each block one store chunk
    assert 1 < slabs.write["time"] < 2920 and slabs.write["lon"] == 720
    assert "each written in slabs of" in slabs.describe()
    whole = staging.staging_chunks(source, planned, 4, 514e6, None, sizes, slabs=False)
    assert whole.store["time"] == whole.write["time"] == slabs.write["time"]
    # time last: a write task's part of a chunk is not one run of its file
    last = staging.staging_chunks(
        {"lat": 288, "lon": 720, "time": 1},
        {"lat": 288, "lon": 72, "time": 2920},
        4,
        514e6,
        None,
        {"lat": 288, "lon": 720, "time": 2920},
        slabs=True,
    )
    assert last.store["time"] == last.write["time"] < 2920


def test_slab_writes_are_for_the_dtypes_a_staged_store_holds_as_they_are():
    assert staging.slab_writes(np.dtype("float32")) and staging.slab_writes(np.dtype("int64"))
    assert staging.slab_writes(np.dtype("bool"))  # zarr 3 stores booleans as they are
    assert not staging.slab_writes(np.dtype("datetime64[ns]"))  # xarray writes int64
    assert not staging.slab_writes(np.dtype(">f8"))


def test_a_graph_whose_blocks_are_not_its_dtype_is_staged_in_slabs_equal(tmp_path, threaded):
    """Review of the slab writes: blocks of another dtype than the graph declares went to
    zarr, whose writes of whole chunk files lost other tasks' slabs (92% of a median wrong)."""
    from xarray_memchunk.operators.staging import StagingChunks, StagingSite

    values = np.random.default_rng(4).standard_normal((60, 6, 10)).astype("float32")
    base = xr.DataArray(values, dims=("time", "lat", "lon"), name="v").chunk({"time": 5})
    widened = base.copy(data=base.data.map_blocks(lambda b: b.astype("float64"), dtype="float32"))
    chunks = StagingChunks(
        store={"time": 60, "lat": 6, "lon": 5},
        write={"time": 5, "lat": 6, "lon": 10},
        source={"time": 5, "lat": 6, "lon": 10},
    )
    staged = staging.stage(widened, StagingSite(tmp_path, 10**9, 0.0), chunks)
    np.testing.assert_array_equal(staged.values, values)
    xm.remove_staged_stores()


def test_cf_attributes_are_not_decoded_on_the_way_back(tmp_path, threaded):
    """Review: attrs of a variable opened undecoded (scale_factor, time units) were written
    with the staged data and decoded when read back (a median 100x too small)."""
    from xarray_memchunk.operators.staging import StagingSite

    values = np.arange(2 * 3 * 4, dtype="int16").reshape(2, 3, 4)
    attrs = {"scale_factor": 0.01, "add_offset": 5.0, "units": "days since 2000-01-01"}
    da = xr.DataArray(values, dims=("time", "lat", "lon"), name="v", attrs=attrs).chunk({"time": 1})
    staged = staging.stage(da, StagingSite(tmp_path, 10**9, 0.0))
    assert staged.dtype == values.dtype and staged.attrs == attrs
    np.testing.assert_array_equal(staged.values, values)
    xm.remove_staged_stores()


def test_a_staged_chunk_file_that_is_gone_is_an_error_not_fill_values(tmp_path, threaded):
    from xarray_memchunk.errors import MemchunkError
    from xarray_memchunk.operators.staging import StagingSite

    values = np.random.default_rng(5).standard_normal((8, 3, 4)).astype("float32")
    da = xr.DataArray(values, dims=("time", "lat", "lon"), name="v").chunk({"time": 2})
    staged = staging.stage(da, StagingSite(tmp_path, 10**9, 0.0))
    store = next(tmp_path.glob(f"{staging.STORE_PREFIX}*.zarr"))
    files = [f for f in (store / "v" / "c").rglob("*") if f.is_file()]
    assert len(files) == 4  # every chunk written, those of fill values too
    for chunk in files:
        chunk.unlink()  # an age-based cleaner of the temporary directory, say
    with pytest.raises(MemchunkError, match="lost its chunk file"):
        staged.compute()
    xm.remove_staged_stores()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_refusal_whose_writes_are_over_the_budget_states_the_staged_minimum(threads):
    """A new user's median of six yearly netCDF files (one chunk a year, converted to
    Celsius) on 1 GB workers was refused with 2.20 GiB, the in-memory route's minimum; staged,
    it ran from 1.31 GB. The refusal now states the least limit either way, and at it the plan
    stages the data."""
    from xarray_memchunk.datasets import synthetic_climate
    from xarray_memchunk.errors import InfeasiblePlanError
    from xarray_memchunk.memory_limits import make_budget
    from xarray_memchunk.units import format_size_up

    celsius = synthetic_climate(730, 90, 180, chunks={"time": 365}).tas - 273.15

    def plan(limit: int):
        return celsius.memchunk.plan(
            "median", dim="time", budget=make_budget(limit, threads, 2, "test")
        )

    with pytest.raises(InfeasiblePlanError, match="writing one of the data's chunks") as refused:
        plan(400_000_000)
    minimum = refused.value.minimum_memory_limit
    assert f"at least {format_size_up(minimum)} (memory_limit)" in str(refused.value)
    staged = plan(minimum)
    assert any("temporary Zarr store" in n for n in staged.notes)
    assert staged.staging_task_bytes <= staged.budget.per_task
    with pytest.raises(InfeasiblePlanError):
        plan(int(0.98 * minimum))

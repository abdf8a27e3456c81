"""Zarr / netCDF end to end, safe writes, and the memchunk command line through subprocess."""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import dask
import numpy as np
import psutil
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk import interrupts
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic
from xarray_memchunk.io import check_target, is_dataset

MEMCHUNK = [sys.executable, "-m", "xarray_memchunk.cli"]
#: ``memchunk`` whose write first waits for a task that sleeps in a worker: the partial output
#: exists, and a signal or a lost scheduler lands while the run waits for its cluster.
SLOW_WRITE = [
    sys.executable,
    "-c",
    """
import sys, time
import dask
from xarray_memchunk import cli

computer = cli._computer

def slow_computer(client):
    compute = computer(client)
    def slow(delayed):
        pause = dask.delayed(time.sleep, pure=False)(60)
        return compute(dask.delayed(lambda write, _: write)(delayed, pause))
    return slow

cli._computer = slow_computer
sys.exit(cli.main(sys.argv[1:]))
""",
]
#: Ways a ``SLOW_WRITE`` interrupted is kept from ending, each set up before it runs; its
#: deadline is 3 s.
STUCK = {
    "a cluster that does not stop": """
import contextlib
own_client = cli._client

@contextlib.contextmanager
def stuck_client(args):
    with own_client(args) as client:
        try:
            yield client
        finally:
            time.sleep(600)

cli._client = stuck_client
""",
    "an interrupt a library caught": """
def swallowing_computer(client):
    compute = slow_computer(client)
    def swallowing(delayed):
        try:
            compute(delayed)
        except BaseException:
            time.sleep(600)
    return swallowing

cli._computer = swallowing_computer
""",
}


def memchunk(*args, timeout=300):
    return subprocess.run(
        [*MEMCHUNK, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def start(command, *args):
    """Start a command line in its own process group, its stderr to a file.

    Not to pipes: a pipe that nobody reads while the command runs stops the command at its
    next write once 64 KiB wait in it (a scheduler's log, a slow machine's warnings).
    """
    stderr = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [*command, *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    proc.stderr_file = stderr  # Popen keeps a file it is given nowhere
    return proc


def finish(proc, timeout=60):
    """Wait for a command from :func:`start` to end; what it wrote to stderr.

    One that does not end in time is killed, with the processes it started: a failed test
    leaves no cluster behind.
    """
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the command had not ended {timeout} s later:\n{stderr_of(proc)}")
    return stderr_of(proc)


def stderr_of(proc):
    proc.stderr_file.seek(0)
    return proc.stderr_file.read().decode(errors="replace")


def wait_for(condition, timeout=120, proc=None):
    """Wait until ``condition()``; fail at once, with its stderr, if ``proc`` ends first."""
    deadline = time.time() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended ({proc.returncode}) first:\n{stderr_of(proc)}")
        assert time.time() < deadline, f"timed out waiting after {timeout} s"
        time.sleep(0.05)


def start_scheduler(tmp_path):
    """A ``dask scheduler`` started apart, once it is ready: its process and its address."""
    scheduler_file = tmp_path / "scheduler.json"
    scheduler = start(
        [sys.executable, "-m", "distributed.cli.dask_scheduler"],
        *["--scheduler-file", scheduler_file, "--host", "127.0.0.1", "--port", "0"],
        *["--dashboard-address", ":0"],
    )
    try:
        wait_for(scheduler_file.exists, timeout=60, proc=scheduler)
    except BaseException:
        kill(scheduler)
        raise
    return scheduler, json.loads(scheduler_file.read_text())["address"]


def wait_for_workers(address, count, timeout=60):
    """Wait until ``count`` workers have joined the scheduler at ``address``.

    A command started before them would be refused: the cluster has no workers yet.
    """
    from distributed import Client

    with Client(address, timeout=f"{timeout}s") as client:
        client.wait_for_workers(count, timeout=timeout)


def kill(*procs):
    """Kill the commands from :func:`start` that still run, with the processes they started."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def pieces(folder):
    """What safe writes leave beside their targets while under way."""
    return sorted(p.name for p in folder.iterdir() if "memchunk-" in p.name)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    volume = synthetic_seismic((48, 40, 36), dip_degrees=15)
    volume.chunk({"inline": 12, "crossline": 20, "sample": 36}).to_zarr(root / "volume.zarr")
    climate = synthetic_climate(120, 18, 24)
    climate.to_netcdf(root / "tas.nc", encoding={"tas": {"chunksizes": (10, 18, 24)}})
    (root / "notes.txt").write_text("not a dataset\n")
    return root


def test_open_keeps_storage_chunks_and_plan_aligns(files):
    ds = xr.open_zarr(files / "volume.zarr")
    plan = ds.memchunk.plan("gst3d", memory_limit="1GB")
    assert plan.storage_chunks == {"inline": 12, "crossline": 20, "sample": 36}
    assert plan.storage_aligned
    assert all(c % 12 == 0 for c in plan.dask_chunks["inline"][:-1])
    nc = xr.open_dataset(files / "tas.nc", chunks={})
    assert nc.memchunk.plan("median", dim="T", memory_limit="1GB").storage_chunks["time"] == 10


def test_accessor_writes_zarr_and_netcdf_with_plan_chunks(files, tmp_path, threaded):
    ds = xr.open_zarr(files / "volume.zarr")
    dip = ds.memchunk.apply("gst3d", memory_limit="1GB")
    out = dip.memchunk.to_zarr(tmp_path / "dip.zarr")
    back = xr.open_zarr(out)
    plan = ds.memchunk.plan("gst3d", memory_limit="1GB")
    assert back.dip.encoding["chunks"] == tuple(plan.chunks[d] for d in back.dip.dims)
    np.testing.assert_array_equal(back.dip.values, ds.load().memchunk.apply("gst3d").dip.values)
    nc = dip.memchunk.to_netcdf(tmp_path / "dip.nc")
    assert xr.open_dataset(nc).dip.encoding["chunksizes"] == back.dip.encoding["chunks"]
    with pytest.raises(xm.MemchunkError, match=re.escape("exists; pass overwrite=True (or")):
        dip.memchunk.to_zarr(tmp_path / "dip.zarr")
    with pytest.raises(xm.MemchunkError, match=re.escape("overwrite=True (or mode='w') to")):
        dip.memchunk.to_zarr(tmp_path / "dip.zarr", mode="w-")
    assert [p.name for p in tmp_path.iterdir() if "memchunk-" in p.name] == []


def test_xarray_s_write_modes_replace_or_are_refused_before_anything_is_written(tmp_path):
    """``mode="w"`` replaces a store as xarray's does; appending is refused, nothing written."""
    ds = synthetic_climate(20, 6, 8).chunk({"time": 10})
    mean = ds.memchunk.apply("mean", dim="time")
    store = mean.memchunk.to_zarr(tmp_path / "mean.zarr")
    doubled = (2 * ds).memchunk.apply("mean", dim="time")
    doubled.memchunk.to_zarr(store, mode="w")
    xr.testing.assert_allclose(xr.open_zarr(store).load(), 2 * mean.compute())
    for mode in ("a", "r+"):
        refused = re.escape(f"mode={mode!r}") + ".* does not append"
        with pytest.raises(xm.MemchunkError, match=refused):
            mean.memchunk.to_zarr(store, mode=mode)
    with pytest.raises(xm.MemchunkError, match=r"takes 'w' .* or 'w-'"):
        mean.memchunk.to_zarr(store, mode="x")
    with pytest.raises(xm.MemchunkError, match="says both keep and replace"):
        mean.memchunk.to_netcdf(tmp_path / "mean.nc", mode="w-", overwrite=True)
    assert not (tmp_path / "mean.nc").exists()
    for write, target in ((mean.memchunk.to_zarr, store), (mean.memchunk.to_netcdf, "m.nc")):
        with pytest.raises(xm.MemchunkError, match=r"compute=False\): memchunk writes into a"):
            write(tmp_path / target, mode="w", compute=False)  # xarray's delayed write
    assert not (tmp_path / "m.nc").exists()
    xr.testing.assert_allclose(xr.open_zarr(store).load(), 2 * mean.compute())


def test_planned_chunks_are_regular_and_irregular_ones_are_said_and_written_by_the_accessor(
    tmp_path, threaded
):
    """Planned chunks are Zarr's regular ones (all of the longest but the last): balanced ones
    (35, 34, 34) made ``result.memchunk.to_zarr`` merge neighbours, and each task then held a
    neighbour's piece beside the operator (a user function: 105.25 MiB measured against
    90.62 MiB predicted). Chunks given by the user may still be irregular."""
    climate = synthetic_climate(400, 100, 103, chunks={"time": 10})
    with dask.config.set(num_workers=2):  # two tasks at once: more than one chunk
        plan = climate.memchunk.plan("median", dim="time", memory_limit="400MB")
    assert plan.dask_chunks["lon"] == (35, 35, 33)  # the same 3 tasks, the same longest chunk
    assert "to_zarr" not in plan.explain()
    median = climate.tas.median("time").values
    result = climate.memchunk.apply("median", dim="time", memory_limit="400MB")
    result.to_zarr(tmp_path / "plain.zarr")  # as xarray writes it: no rechunk needed
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "plain.zarr").tas.values, median, rtol=1e-6)
    given = {"time": 400, "lon": (35, 34, 34)}
    area = xr.DataArray(np.ones((100, 103)), dims=("lat", "lon")).chunk({"lon": (35, 34, 34)})
    climate = climate.assign_coords(area=area)  # a Dask-backed coordinate, made uniform too
    irregular = climate.memchunk.plan("median", dim="time", memory_limit="400MB", chunks=given)
    assert "result.memchunk.to_zarr(path)" in irregular.explain()
    result = irregular.apply()
    with pytest.raises(ValueError, match="uniform chunk sizes"):
        result.to_zarr(tmp_path / "irregular.zarr")
    written = xr.open_zarr(result.memchunk.to_zarr(tmp_path / "median.zarr"))
    np.testing.assert_allclose(written.tas.values, median, rtol=1e-6)


def test_the_accessor_writes_a_dataset_whose_variables_are_chunked_apart(tmp_path, threaded):
    """A new user's report: a median kept a variable without time as it came (lon whole), and
    ``result.memchunk.to_zarr`` raised "inconsistent chunks along dimension lon"."""
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "tas": (("time", "lat", "lon"), rng.random((200, 40, 60)).astype("float32")),
            "orog": (("lat", "lon"), rng.random((40, 60))),
        }
    ).chunk({"time": 10})
    result = ds.memchunk.apply("median", dim="time", chunks={"time": 200, "lon": 20})
    assert result.tas.chunks[1] == (20, 20, 20) and result.orog.chunks[1] == (60,)
    expected = ds.load().median("time")
    zarr_store = xr.open_zarr(result.memchunk.to_zarr(tmp_path / "median.zarr"))
    assert zarr_store.tas.encoding["chunks"] == (40, 20)  # each variable in its own chunks
    assert zarr_store.orog.encoding["chunks"] == (40, 60)
    xr.testing.assert_allclose(zarr_store.load(), expected)
    netcdf = xr.open_dataset(result.memchunk.to_netcdf(tmp_path / "median.nc"))
    xr.testing.assert_allclose(netcdf.load(), expected)


def test_cli_plan_prints_the_plan(files):
    result = memchunk("plan", "gst3d", files / "volume.zarr", "--memory-limit", "1.5GB")
    assert result.returncode == 0, result.stderr
    assert "predicted per task" in result.stdout and "storage chunks" in result.stdout
    result = memchunk("plan", "median", files / "tas.nc", "--dim", "T", "--memory-limit", "1GB")
    assert result.returncode == 0, result.stderr
    assert "whole " in result.stdout and "time" in result.stdout


def test_cli_no_room_for_a_task_states_the_minimum_the_operator_runs_at(files):
    """A new user's `memchunk run gst3d ... --memory-limit 250MB --nthreads 2` was told "at
    least 238.42 MiB", the limit just refused, and then "at least 429.87 MiB" there."""
    import re

    def plan(limit):
        args = ["--memory-limit", limit, "--nthreads", "2"]
        return memchunk("plan", "gst3d", files / "volume.zarr", *args)

    refused = plan("250MB")
    assert refused.returncode == 2, refused.stdout
    figures = set(re.findall(r"at least (\S+ \S+) \(memory_limit\)", refused.stderr))
    assert len(figures) == 1 and figures != {"238.42 MiB"}, refused.stderr
    planned = plan(figures.pop().replace(" ", ""))
    assert planned.returncode == 0, planned.stderr
    assert "predicted per task" in planned.stdout


def test_cli_run_writes_netcdf_and_refuses_to_overwrite(files, tmp_path):
    target = tmp_path / "median.nc"
    args = [
        "run",
        "median",
        files / "tas.nc",
        target,
        "--dim",
        "T",
        "--nworkers",
        "1",
        "--memory-limit",
        "1GB",
    ]
    result = memchunk(*args)
    assert result.returncode == 0, result.stderr
    written = xr.open_dataset(target)
    expected = xr.open_dataset(files / "tas.nc").tas.median("time")
    np.testing.assert_allclose(written.tas.values, expected.values, rtol=1e-6)
    again = memchunk(*args)
    assert again.returncode == 2 and "exists" in again.stderr
    assert "--overwrite" in again.stderr
    assert memchunk(*args, "--overwrite").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "gst3d", "{root}/missing.zarr"], "does not exist"),
        (["plan", "gst3d", "{root}/notes.txt"], "cannot open"),
        (["plan", "gst3d", "{root}/volume.zarr", "--var", "velocity"], "no variable 'velocity'"),
        (["plan", "gst3d-typo", "{root}/volume.zarr"], "unknown operator"),
        (["plan", "median", "{root}/volume.zarr", "--dim", "T"], "no dim 'T'"),
        (
            ["plan", "gst3d", "{root}/volume.zarr", "--memory-limit", "lots"],
            "cannot parse --memory-limit",
        ),
        (["run", "gst3d", "{root}/volume.zarr", "{root}/tas.nc"], "exists; pass --overwrite to"),
        (["plan", "gst3d", "{root}/volume.zarr", "-o", "sigma"], "KEY=VALUE"),
        (["run", "mean", "{root}/tas.nc", "{root}/tas.nc", "--overwrite"], "is the input"),
        (["run", "mean", "{root}/tas.nc", "{root}", "--overwrite"], "holds the input"),
        (["run", "mean", "{root}/volume.zarr", "{root}/volume.zarr/m.zarr"], "inside the input"),
        (["run", "mean", "{root}/tas.nc", "{root}/notes.txt", "--overwrite"], "replaces only"),
        (
            ["run", "mean", "{root}/tas.nc", "{root}/m.zarr", "--scheduler", "notanaddress"],
            "tcp://",
        ),
        (["run", "mean", "{root}/tas.nc", "{root}/m.zarr", "--nworkers", "100000"], "per CPU"),
        (["demo", "--plot", "{root}/missing/memory.png"], "does not exist"),
        (["calibrate", "mean", "--output-dir", "{root}/notes.txt"], "not a directory"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(files, args, message):
    result = memchunk(*[a.format(root=files) for a in args])
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_overwrite_replaces_a_dataset_never_the_users_other_files(files, tmp_path):
    userdir = tmp_path / "userdir"
    (userdir / "sub").mkdir(parents=True)
    (userdir / "sub" / "thesis.txt").write_text("four years\n")
    result = memchunk("run", "mean", files / "tas.nc", userdir, "--dim", "time", "--overwrite")
    assert result.returncode == 2
    assert "replaces only a dataset" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    mean = xr.open_dataset(files / "tas.nc", chunks={}).memchunk.apply("mean", dim="time")
    with pytest.raises(xm.MemchunkError, match="replaces only a dataset"):
        mean.memchunk.to_zarr(userdir, overwrite=True)
    assert (userdir / "sub" / "thesis.txt").read_text() == "four years\n"
    assert is_dataset(files / "volume.zarr") and is_dataset(files / "tas.nc")
    assert not is_dataset(userdir) and not is_dataset(files / "notes.txt")
    # a store opened from a file is not written over that file, nor through a symlink to it
    store = xr.open_zarr(files / "volume.zarr")
    with pytest.raises(xm.MemchunkError, match="is the input"):
        store.memchunk.to_zarr(files / "volume.zarr", overwrite=True)
    (tmp_path / "link.nc").symlink_to(files / "tas.nc")
    with pytest.raises(xm.MemchunkError, match="is the input"):
        check_target(tmp_path / "link.nc", True, sources=[files / "tas.nc"])
    assert xr.open_zarr(files / "volume.zarr").amplitude.shape == (48, 40, 36)


@pytest.mark.parametrize(("operator", "kwargs"), [("mean", {"dim": "time"}), ("median", {})])
def test_a_result_read_straight_from_a_zarr_store_is_not_written_over_it(
    tmp_path, operator, kwargs
):
    """memchunk's own reads of a store carry no ``encoding["source"]``: the graph names it."""
    store = tmp_path / "precious.zarr"
    synthetic_climate(40, 6, 8).to_zarr(store)
    before = xr.open_zarr(store).tas.values
    result = xr.open_zarr(store).memchunk.apply(operator, memory_limit="1GB", **kwargs)
    assert "source" not in result.encoding
    for target in (store, store / "inside.zarr"):
        with pytest.raises(xm.MemchunkError, match=r"is the input|lies inside"):
            result.memchunk.to_zarr(target, overwrite=True)
    np.testing.assert_array_equal(xr.open_zarr(store).tas.values, before)
    # the volume's gst3d, read straight from its store, alike
    volume = tmp_path / "volume.zarr"
    synthetic_seismic((24, 20, 18)).to_zarr(volume)
    dip = xr.open_zarr(volume).memchunk.apply("gst3d", memory_limit="1GB")
    with pytest.raises(xm.MemchunkError, match="is the input"):
        dip.memchunk.to_zarr(volume, overwrite=True)
    assert xr.open_zarr(volume).amplitude.shape == (24, 20, 18)


def _opened(route: str, path: Path) -> xr.Dataset:
    """The dataset at ``path`` opened as ``route`` opens it."""
    from zarr.storage import ZipStore

    if route == "zip":
        return xr.open_zarr(ZipStore(path, mode="r"))
    if route == "file URL":
        return xr.open_zarr(path.as_uri())
    return xr.open_dataset(path, engine="scipy", chunks={})


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")  # zarr's zip writes
@pytest.mark.parametrize(
    ("route", "name"), [("zip", "precious.zip"), ("file URL", "precious.zarr"), ("scipy", "p.nc")]
)
def test_a_store_opened_as_a_zip_a_url_or_by_scipy_is_not_written_over(tmp_path, route, name):
    """Zarr's ``ZipStore`` and ``FsspecStore`` name their file by ``path``, scipy's store by its
    file manager: the graph names them all, and the write is refused before it starts."""
    from zarr.storage import ZipStore

    source = tmp_path / name
    data = synthetic_climate(40, 6, 8)
    if route == "zip":
        with ZipStore(source, mode="w") as store:
            data.to_zarr(store)
    elif route == "file URL":
        data.to_zarr(source)
    else:
        data.to_netcdf(source, engine="scipy")
    before = source.read_bytes() if source.is_file() else None
    for operator, kwargs in (("mean", {"dim": "time"}), ("median", {})):
        result = _opened(route, source).memchunk.apply(operator, memory_limit="1GB", **kwargs)
        with pytest.raises(xm.MemchunkError, match="is the input"):
            result.memchunk.to_zarr(source, overwrite=True)
    if before is not None:
        assert source.read_bytes() == before
    np.testing.assert_array_equal(_opened(route, source).tas.values, data.tas.values)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "moment", "status"),
    [
        (signal.SIGTERM, "cluster start", 143),
        (signal.SIGTERM, "worker start", 143),
        (signal.SIGTERM, "write", 143),
        (signal.SIGINT, "write", 130),
    ],
)
def test_interrupted_run_is_one_line_and_keeps_the_old_output(
    files, tmp_path, signum, moment, status
):
    target = tmp_path / "mean.zarr"
    xr.Dataset({"tas": ("x", np.arange(5.0))}).to_zarr(target)
    args = ["run", "mean", files / "tas.nc", target, "--dim", "time", "--overwrite"]
    args += ["--nworkers", "1", "--memory-limit", "1GB"]
    proc = start(SLOW_WRITE if moment == "write" else MEMCHUNK, *args)
    if moment == "write":
        wait_for(lambda: pieces(tmp_path), proc=proc)
    else:  # the LocalCluster's first worker process is starting
        wait_for(lambda: psutil.Process(proc.pid).children(), proc=proc)
        if moment == "worker start":  # and has started a little: its cluster prints as it
            time.sleep(0.3)  # ends (29 lines in 17 of 20 runs, with fd 2 given back)
    proc.send_signal(signum)
    stderr = finish(proc)
    assert proc.returncode == status, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert f"interrupted by {signal.Signals(signum).name}" in stderr
    np.testing.assert_array_equal(xr.open_zarr(target).tas.values, np.arange(5.0))
    assert pieces(tmp_path) == []


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("stuck", sorted(STUCK))
def test_an_interrupted_run_that_cannot_stop_ends_at_its_deadline(files, tmp_path, stuck):
    """CI: a SIGTERM while the worker ran a 60 s task, and the command had not ended 60 s
    later. Whatever keeps it, the command ends at its deadline, its cluster's processes with
    it, the old output kept and the partial one removed."""
    target = tmp_path / "mean.zarr"
    xr.Dataset({"tas": ("x", np.arange(5.0))}).to_zarr(target)
    setup = "from xarray_memchunk import interrupts\ninterrupts.STOP_DEADLINE_S = 3\n"
    setup += STUCK[stuck]
    script = SLOW_WRITE[2].replace("sys.exit(", f"{setup}\nsys.exit(")
    args = ["run", "mean", files / "tas.nc", target, "--dim", "time", "--overwrite"]
    proc = start([sys.executable, "-c", script], *args, "--nworkers", "1", "--memory-limit", "1GB")
    wait_for(lambda: pieces(tmp_path), proc=proc)
    time.sleep(1)  # the sleeping task has started
    began = time.time()
    proc.send_signal(signal.SIGTERM)
    stderr = finish(proc)
    assert proc.returncode == 143, stderr
    assert time.time() - began < 30, stderr
    (line,) = stderr.strip().splitlines()
    assert re.fullmatch(
        r"memchunk: interrupted by SIGTERM: it had not stopped 3 s later and its \d+ cluster "
        r"process\(es\) were killed; nothing more written, partial output removed",
        line,
    )
    wait_for(lambda: not _group_alive(proc.pid), timeout=10)
    np.testing.assert_array_equal(xr.open_zarr(target).tas.values, np.arange(5.0))
    assert pieces(tmp_path) == []


def _group_alive(group: int) -> bool:
    """Whether a process of the process group ``group`` is alive (a zombie is not)."""
    return any(
        p.info["status"] != psutil.STATUS_ZOMBIE
        for p in psutil.process_iter(["status"])
        if _group_of(p) == group
    )


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


@pytest.mark.cluster
@pytest.mark.slow
def test_next_run_removes_what_a_killed_run_left(files, tmp_path):
    target = tmp_path / "mean.zarr"
    xr.Dataset({"tas": ("x", np.arange(5.0))}).to_zarr(target)
    args = ["run", "mean", files / "tas.nc", target, "--dim", "time"]
    args += ["--nworkers", "1", "--memory-limit", "1GB"]
    proc = start(SLOW_WRITE, *args, "--overwrite")
    wait_for(lambda: pieces(tmp_path), proc=proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the client, its LocalCluster and workers
    proc.wait(timeout=30)
    assert pieces(tmp_path)[0].startswith(".mean.zarr.memchunk-partial-")
    refused = memchunk(*args)  # the old output stays: refused, but the leftover goes
    assert refused.returncode == 2 and "exists" in refused.stderr
    assert "a write interrupted before it ended" in refused.stdout
    assert pieces(tmp_path) == []
    again = memchunk(*args, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert pieces(tmp_path) == []
    expected = xr.open_dataset(files / "tas.nc").tas.mean("time")
    np.testing.assert_allclose(xr.open_zarr(target).tas.values, expected.values, rtol=1e-6)


@pytest.mark.cluster
@pytest.mark.slow
def test_lost_scheduler_is_one_line(files, tmp_path):
    scheduler, address = start_scheduler(tmp_path)
    worker = None
    try:
        worker = start(
            [sys.executable, "-m", "distributed.cli.dask_worker"],
            *[address, "--nthreads", "1", "--memory-limit", "1GB", "--dashboard-address", ":0"],
        )
        wait_for_workers(address, 1)
        target = tmp_path / "mean.zarr"
        run = start(
            SLOW_WRITE,
            *["run", "mean", files / "tas.nc", target, "--dim", "time", "--scheduler", address],
        )
        wait_for(lambda: pieces(tmp_path), proc=run)
        os.killpg(scheduler.pid, signal.SIGKILL)
        killed = time.time()
        stderr = finish(run)
        ended_after_s = time.time() - killed
    finally:
        kill(scheduler, worker)
    assert run.returncode == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert f"lost the connection to scheduler {address}" in stderr
    assert ended_after_s < 20  # a 10 s connection timeout, not distributed's 30 s
    assert not target.exists()
    assert pieces(tmp_path) == []


def test_killed_run_leaves_old_target_intact(files, tmp_path):
    source = tmp_path / "big.zarr"
    synthetic_seismic((160, 160, 160), chunks=80).to_zarr(source)
    target = tmp_path / "dip.zarr"
    old = xr.Dataset({"dip": ("x", np.arange(5.0))})
    old.to_zarr(target)
    args = ["run", "gst3d", source, target, "--overwrite", "--nworkers", "1"]
    proc = start(MEMCHUNK, *args, "--memory-limit", "2GB")
    wait_for(lambda: any("memchunk-" in p.name for p in tmp_path.iterdir()), proc=proc)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the client, its LocalCluster and workers: all at once
    proc.wait(timeout=30)
    intact = xr.open_zarr(target)
    np.testing.assert_array_equal(intact.dip.values, np.arange(5.0))
    leftovers = [p for p in tmp_path.iterdir() if p.name not in {"big.zarr", "dip.zarr"}]
    # whatever a hard kill leaves is hidden and never named like the target
    assert all(p.name.startswith(".dip.zarr.memchunk-partial-") for p in leftovers)


@pytest.mark.cluster
@pytest.mark.slow
def test_ctrl_c_at_a_terminal_is_one_line(tmp_path):
    """A terminal sends Ctrl-C to the command's whole process group: a new user's run printed
    67 lines, the tracebacks of the cluster's computing workers, around its own one."""
    source = tmp_path / "volume.zarr"
    synthetic_seismic((160, 160, 160), chunks=80).to_zarr(source)
    target = tmp_path / "dip.zarr"
    proc = start(MEMCHUNK, "run", "gst3d", source, target, "--memory-limit", "1GB")
    wait_for(lambda: any("memchunk-" in p.name for p in tmp_path.iterdir()), proc=proc)
    time.sleep(0.5)  # its workers computing
    os.killpg(proc.pid, signal.SIGINT)
    stderr = finish(proc)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        "memchunk: interrupted by SIGINT: nothing more written, partial output removed"
    ]


def test_cli_help_reads_well():
    result = memchunk("run", "--help")
    assert result.returncode == 0
    for flag in ("--nworkers", "--nthreads", "--memory-limit", "--scheduler", "--overwrite"):
        assert flag in result.stdout
    assert "1.5GB" in memchunk("plan", "--help").stdout


def test_an_interrupt_while_the_command_starts_is_one_line():
    """Issue 27 item 8: SIGTERM during the imports ended the command with -15 and no word."""
    memchunk = Path(sys.executable).with_name("memchunk")
    proc = subprocess.Popen(
        [str(memchunk), "operators"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(0.2)  # importing xarray, Dask and the package takes longer
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert len(err.strip().splitlines()) == 1 and "interrupted by SIGTERM" in err


def test_an_interrupt_while_starting_ends_the_command_even_where_an_import_catches_all():
    """A SIGTERM in an import whose bare ``except:`` caught the launcher's ``SystemExit``: the
    command went on and ended with status 0 (1 in 88 runs of ``memchunk operators``)."""
    code = (
        "import os, signal, _memchunk_launcher as launcher\n"
        "signal.signal(signal.SIGTERM, launcher._interrupted_while_starting)\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "except BaseException:\n"
        "    pass\n"
        "print('went on')\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode == 143, done
    assert "went on" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        "memchunk: interrupted by SIGTERM while starting: nothing was written"
    ]


@pytest.mark.cluster
def test_plan_shows_the_plan_that_run_runs(tmp_path, capsys):
    """`memchunk plan` planned for the threaded scheduler, `memchunk run` for its LocalCluster."""
    from xarray_memchunk import cli
    from xarray_memchunk.datasets import synthetic_climate

    path = tmp_path / "tas.nc"
    synthetic_climate(120, 18, 24).to_netcdf(path)
    common = ["mean", str(path), "--dim", "time"]
    assert cli._main(["plan", *common]) == 0
    planned = capsys.readouterr().out
    assert cli._main(["run", *common, str(tmp_path / "mean.zarr")]) == 0
    ran = capsys.readouterr().out

    def lines(out: str, start: str) -> list[str]:
        return [line for line in out.splitlines() if line.startswith(start)]

    for row in ("chunks", "peak", "budget"):
        assert lines(planned, row) == lines(ran, row)[:1], row
    assert "the LocalCluster to start" in lines(planned, "budget")[0]


@pytest.mark.parametrize(
    ("config", "environment", "expected"),
    [({}, None, 1.0), ({"worker-saturation": 1.5}, None, 1.5), ({}, "1.1", 1.1)],
)
def test_run_cluster_sends_each_worker_its_next_task_when_it_asks(
    config, environment, expected, monkeypatch
):
    """``run``'s own LocalCluster queues one root task per thread, unless the user set the depth.

    A depth set in the environment is the user's, even at distributed's default.
    """
    if environment is not None:
        monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION", environment)
    import argparse

    import dask

    from xarray_memchunk import cli

    args = argparse.Namespace(scheduler=None, nworkers=1, nthreads=1, memory_limit="500MB")
    settings = {f"distributed.scheduler.{k}": v for k, v in config.items()}
    with dask.config.set(settings), cli._client(args) as client:
        saturation = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.WORKER_SATURATION
        )
    assert saturation == expected


def test_cli_opens_a_pattern_of_netcdf_files_as_one_dataset(tmp_path):
    """A trial: data held as yearly netCDF files (open_mfdataset in Python) could not be given
    to the command line: a pattern said "does not exist", a directory "GroupNotFoundError"."""
    data = synthetic_climate(60, 6, 8)
    for part in range(3):
        data.isel(time=slice(20 * part, 20 * (part + 1))).to_netcdf(tmp_path / f"tas_{part}.nc")
    pattern = str(tmp_path / "tas_*.nc")
    args = ["--nworkers", "1", "--memory-limit", "1GB"]
    ran = memchunk("run", "median", pattern, tmp_path / "m.zarr", "--dim", "time", *args)
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(
        xr.open_zarr(tmp_path / "m.zarr").tas.values, data.tas.median("time").values, rtol=1e-6
    )
    none = memchunk("plan", "median", str(tmp_path / "pr_*.nc"), "--dim", "time")
    assert none.returncode == 2 and "matches no file" in none.stderr
    over = memchunk(  # an output that is one of the files matched
        "run", "median", pattern, tmp_path / "tas_1.nc", "--dim", "time", "--overwrite", *args
    )
    assert over.returncode == 2 and "is the input" in over.stderr
    assert xr.open_dataset(tmp_path / "tas_1.nc").sizes["time"] == 20


def test_an_input_whose_name_holds_a_bracket_is_opened_as_named(tmp_path):
    """A review: "run[1].nc" was taken as a pattern, and opened "run1.nc" beside it."""
    from xarray_memchunk.io import open_input

    xr.Dataset({"x": ("i", np.full(3, 5.0))}).to_netcdf(tmp_path / "run[1].nc")
    xr.Dataset({"x": ("i", np.full(3, 3.0))}).to_netcdf(tmp_path / "run1.nc")
    assert float(open_input(tmp_path / "run[1].nc")["x"][0]) == 5.0
    assert float(open_input(str(tmp_path / "run?.nc"))["x"][0]) == 3.0  # a pattern: run1.nc


def test_an_interrupt_after_the_new_output_is_in_place_says_it_was_written(tmp_path, capsys):
    """A new user's Ctrl-C while the report printed: the new output was in place and the old
    one gone, and the line said 'partial output removed' (ingest: no line at all)."""
    from xarray_memchunk import cli

    target = tmp_path / "out.zarr"
    xr.Dataset({"v": ("x", np.zeros(3))}).to_zarr(target)
    args = argparse.Namespace(output=str(target))

    def replaces_then_is_interrupted() -> None:
        xr.Dataset({"v": ("x", np.ones(3))}).to_zarr(tmp_path / "new.zarr")
        shutil.rmtree(target)
        (tmp_path / "new.zarr").rename(target)
        raise KeyboardInterrupt

    def is_interrupted() -> None:
        raise KeyboardInterrupt

    for run, says in (
        (is_interrupted, "nothing more written, partial output removed"),
        (replaces_then_is_interrupted, f"{target} had been written whole before it"),
    ):
        with pytest.raises(KeyboardInterrupt) as caught:
            cli._writing(args, run)
        assert interrupts.report(caught.value, getattr(caught.value, "written", None)) == 130
        assert capsys.readouterr().err == f"memchunk: interrupted by SIGINT: {says}\n"
    np.testing.assert_array_equal(xr.open_zarr(target).v.values, np.ones(3))


def test_an_output_directory_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path, monkeypatch
):
    """A new user's run on a read-only mount planned, started its cluster and failed 7 s later
    with 'OSError: [Errno 30] Read-only file system'."""
    from xarray_memchunk import io

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.access(locked, os.W_OK):  # root: permissions do not stop it, a read-only mount would
        real = os.access
        monkeypatch.setattr(
            io.os, "access", lambda path, mode: Path(path) != locked and real(path, mode)
        )
    mean = synthetic_climate(20, 4, 5, chunks={"time": 10}).memchunk.apply("mean", dim="time")
    with pytest.raises(xm.MemchunkError, match=r"'.*locked' cannot be written"):
        mean.memchunk.to_zarr(locked / "mean.zarr")
    assert list(locked.iterdir()) == []


def test_the_command_run_in_python_gives_back_the_callers_signal_handlers(capsys):
    """A review found SIGINT and SIGTERM ignored after ``cli.main`` in a Python session."""
    from xarray_memchunk import cli

    before = {s: signal.getsignal(s) for s in interrupts.INTERRUPTS}
    assert cli.main(["operators"]) == 0
    assert {s: signal.getsignal(s) for s in interrupts.INTERRUPTS} == before
    assert "gst3d" in capsys.readouterr().out


#: Set up for the scripts below: a command ``operators`` replaced by ``command(args)``, short
#: deadlines, and a target with a partial piece beside it, in the folder ``sys.argv[1]``.
INTERRUPTED_IN_PYTHON = """
import argparse, os, signal, sys, time
from pathlib import Path
from xarray_memchunk import cli, interrupts, io
interrupts.STOP_DEADLINE_S = 0.5
interrupts.RECOVERY_WAIT_S = 5
target = Path(sys.argv[1]) / "out.zarr"
(target.parent / ".out.zarr.memchunk-partial-1").mkdir()
args = argparse.Namespace(output=str(target))

def signal_self(signum=signal.SIGTERM):
    os.kill(os.getpid(), signum)
    time.sleep(2)  # the handler raises here
"""

STUCK_IN_PYTHON = {
    "a caller in Python goes on after the command": """
cli._cmd_operators = lambda _: signal_self(signal.SIGINT)
status = cli.main(["operators"])
time.sleep(2)  # past the deadline
print("went on", status, flush=True)
print("stderr is back", file=sys.stderr)
""",
    "a recovery under way at the deadline is waited for": """
real = io.recover
io.recover = lambda path: (time.sleep(2), real(path))[1]
cli._cmd_operators = lambda _: cli._writing(args, signal_self)
sys.exit(cli.main(["operators"], exiting=True))
""",
    "a signal while the resource tracker starts": """
from multiprocessing import resource_tracker
real = resource_tracker.ensure_running
resource_tracker.ensure_running = lambda: (signal_self(), real())
def command(_):
    interrupts.quiet_resource_tracker()
    print("noise", file=sys.stderr)
cli._cmd_operators = command
sys.exit(cli.main(["operators"], exiting=True))
""",
    "a failure after an interrupt a library caught": """
def run():
    try:
        signal_self()
    except BaseException:
        pass
    raise RuntimeError("a worker's error")
cli._cmd_operators = lambda _: cli._writing(args, run)
sys.exit(cli.main(["operators"], exiting=True))
""",
    "exit handlers after the line": """
import atexit
atexit.register(time.sleep, 20)  # as distributed's clean-up of a close cut short: 10 s
cli._cmd_operators = lambda _: signal_self()
sys.exit(cli.main(["operators"], exiting=True))
""",
    "a command that went on after an interrupt a library caught": """
def command(_):
    try:
        signal_self()
    except BaseException:
        pass
    return 0
cli._cmd_operators = command
sys.exit(cli.main(["operators"], exiting=True))
""",
}


@pytest.mark.parametrize("case", sorted(STUCK_IN_PYTHON))
def test_an_interrupt_ends_the_command_with_one_line_whatever_catches_it(tmp_path, case):
    """A review's cases: the deadline killed a Python caller after the command had returned,
    cut a recovery short, and lost the line where a signal came while the resource tracker
    started or a library caught the interrupt."""
    script = INTERRUPTED_IN_PYTHON + STUCK_IN_PYTHON[case]
    began = time.time()
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    if case.startswith("exit handlers"):  # a new user's SIGTERM as the cluster closed: the
        assert time.time() - began < 15, done  # line, then 10.4 s of distributed's clean-up
    lines = done.stderr.strip().splitlines()
    if case.startswith("a caller"):
        assert done.returncode == 0 and "went on 130" in done.stdout, done
        said = "memchunk: interrupted by SIGINT: nothing more written, partial output removed"
        assert lines == [said, "stderr is back"]
        return
    assert done.returncode == 143, done
    said = "memchunk: interrupted by SIGTERM: nothing more written, partial output removed"
    assert lines == [said]
    if "recovery" in case or "failure" in case:
        assert pieces(tmp_path) == []


@pytest.mark.cluster
def test_a_failure_after_the_scheduler_is_gone_is_a_lost_scheduler_even_before_the_client_knows(
    tmp_path,
):
    """distributed can fail a computation on a killed scheduler (its own ``RuntimeError`` from
    an expiring timeout) before the client leaves its "running" status: the address decides."""
    from xarray_memchunk import cli
    from xarray_memchunk.errors import MemchunkError

    scheduler, address = start_scheduler(tmp_path)
    try:
        with pytest.raises(MemchunkError, match=f"lost the connection to scheduler {address}"):
            with cli._scheduler_client(address) as client:
                held = threading.Event()  # the client's event loop waits: it cannot notice
                client.loop.add_callback(held.wait, 30)
                os.killpg(scheduler.pid, signal.SIGKILL)
                scheduler.wait(timeout=30)
                assert client.status == "running"
                threading.Timer(1.0, held.set).start()  # free to close the client afterwards
                raise RuntimeError("Cannot change state of expiring Timeout")
    finally:
        kill(scheduler)


@pytest.mark.cluster
def test_watch_samples_dask_worker_processes_started_apart(tmp_path):
    """A new user's ``watch`` of ``dask worker`` processes they had started reported no peak
    (``{}``): it sampled only a LocalCluster's spawned children."""
    from distributed import Client

    from xarray_memchunk.testing import watch

    scheduler, address = start_scheduler(tmp_path)
    worker = None
    try:
        worker = start(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--no-nanny"],
            *["--nthreads", "1", "--memory-limit", "1GB", "--dashboard-address", ":0"],
        )
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=60)
            (pid,) = client.run(os.getpid).values()
            held = 200 * 2**20

            def hold():
                ones = np.ones(held // 8)
                time.sleep(1.0)  # sampled every 20 ms, its pid asked every 0.25 s
                return ones.sum()

            def work():
                client.submit(hold, pure=False).result()

            outcome = watch(client, "ones", work)
    finally:
        kill(scheduler, worker)
    assert outcome.completed, outcome.error
    assert list(outcome.peak_worker_bytes) == [pid]
    assert outcome.peak_bytes > held

"""Staged stores left by killed processes are removed by the next plan that stages."""

import json
import os
import socket
import subprocess
import sys
import time

import dask
import numpy as np
import psutil
import pytest

from xarray_memchunk.operators import staged_stores, staging

SCRIPT = """\
import os, signal
import dask, dask.array as da, xarray as xr
import xarray_memchunk
dask.config.set({{"memchunk.staging-dir": {directory!r}}})
data = da.random.default_rng(3).random((600, 200, 200), chunks=(50, 200, 200))
t = xr.DataArray(data, dims=("time", "y", "x"), name="t")
median = t.memchunk.apply("median", dim="time", memory_limit="0.5GB")
assert median.isel(y=0, x=0).compute() >= 0
os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` ends it: no exit handlers run
"""


def test_a_store_of_a_killed_script_is_removed_by_the_next_staging(tmp_path):
    # a plain script (no __main__ guard) stages its median, then is killed as `timeout` kills
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(directory=str(tmp_path / "staging")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == -15, done.stderr
    (left,) = (tmp_path / "staging").glob("memchunk-staged-*.zarr")
    assert staged_stores.owner_file(left).exists()
    own = staging.stage(_small(), staging.StagingSite(tmp_path / "staging", 10**9, 0.0))
    with dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path / "staging")}):
        site = staging.staging_site(10**6, measure_bandwidth=False)
    assert not site.refusal
    assert not left.exists() and not staged_stores.owner_file(left).exists()
    # this process's own store, still read, is kept
    (kept,) = (tmp_path / "staging").glob("memchunk-staged-*.zarr")
    assert own.sum().compute() > 0 and kept.exists()


def _small():
    import dask.array as da
    import xarray as xr

    data = da.random.default_rng(1).random((20, 10, 10), chunks=(5, 10, 10))
    return xr.DataArray(data, dims=("time", "y", "x"), name="t")


def _owned(directory, name, **owner):
    store = directory / f"memchunk-staged-{name}.zarr"
    store.mkdir()
    (store / "zarr.json").write_text("{}")
    staged_stores.owner_file(store).write_text(json.dumps(owner))
    return store


def _owner(pid, /, **changed):
    """An owner file's fields for process ``pid`` as this machine writes them, then ``changed``."""
    process = psutil.Process(pid)
    owner = staged_stores._machine() | {"pid": pid, "started": process.create_time()}
    if "boot_id" in owner:
        owner["start_ticks"] = staged_stores._linux_start(pid)[0]
    return owner | changed


def test_only_stores_of_ended_processes_here_are_removed(tmp_path):
    me = os.getpid()
    mine = _owned(tmp_path, "a" * 12, **_owner(me))
    earlier = _owner(me, started=psutil.Process().create_time() - 3600)
    if "start_ticks" in earlier:  # Linux: the start in ticks after boot is what is compared
        earlier["start_ticks"] -= 1000
    reused = _owned(tmp_path, "b" * 12, **earlier)
    other_host = _owned(tmp_path, "c" * 12, **_owner(me, host="another-host", pid=2**22 + 7))
    unreadable = _owned(tmp_path, "d" * 12)
    staged_stores.owner_file(unreadable).write_text("{not json")
    without_owner = tmp_path / f"memchunk-staged-{'e' * 12}.zarr"
    without_owner.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ended_owner = _owner(child.pid)
    child.wait()
    ended = _owned(tmp_path, "f" * 12, **ended_owner)
    orphan_owner = staged_stores.owner_file(tmp_path / f"memchunk-staged-{'0' * 12}.zarr")
    orphan_owner.write_text(json.dumps(ended_owner))

    removed = staged_stores.remove_orphans(tmp_path)

    assert removed == [reused, ended]  # a process id reused by this process; one ended
    assert not reused.exists() and not ended.exists() and not orphan_owner.exists()
    assert all(p.exists() for p in (mine, other_host, unreadable, without_owner))


def test_a_store_of_a_killed_process_not_yet_reaped_is_removed(tmp_path):
    # a harness that holds its Popen: the killed child stays a zombie until it is waited for
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    store = _owned(tmp_path, "a" * 12, **_owner(child.pid))
    child.kill()
    for _ in range(1000):  # until the kernel has ended it (at most 10 s)
        if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.01)
    try:
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert staged_stores.remove_orphans(tmp_path) == [store]
    finally:
        child.wait()


def test_a_store_of_another_pid_namespace_or_boot_is_left(tmp_path):
    # containers sharing a host name and a staging directory number their processes apart
    machine = staged_stores._machine()
    if "boot_id" not in machine:
        return  # elsewhere than Linux, the host name is all that is compared
    gone = 2**22 + 11  # above Linux's largest pid: no such process here
    namespace = _owned(tmp_path, "a" * 12, **_owner(os.getpid(), pid=gone, pid_namespace=1))
    boot = _owned(tmp_path, "b" * 12, **_owner(os.getpid(), pid=gone, boot_id="another"))
    here = _owned(tmp_path, "c" * 12, **_owner(os.getpid(), pid=gone))
    assert staged_stores.remove_orphans(tmp_path) == [here]
    assert namespace.exists() and boot.exists()


def test_the_owner_file_names_this_process_and_is_written_whole(tmp_path):
    store = tmp_path / "memchunk-staged-123456789abc.zarr"
    staged_stores.claim(store)
    owner = json.loads(staged_stores.owner_file(store).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert abs(owner["started"] - psutil.Process().create_time()) < 1e-6
    assert {"boot_id", "pid_namespace", "start_ticks"} <= set(owner) or sys.platform != "linux"
    assert [p.name for p in tmp_path.iterdir()] == [staged_stores.owner_file(store).name]
    staged_stores.release(store)
    assert not list(tmp_path.iterdir())


def test_remove_staged_stores_frees_the_disk_once_the_results_are_computed(tmp_path, threaded):
    import xarray_memchunk as xm

    data = _small()
    staged = staging.stage(data, staging.StagingSite(tmp_path, 10**9, 0.0))
    median = staged.median("time").persist()  # computed: the store is no longer read
    (store,) = tmp_path.glob("memchunk-staged-*.zarr")
    assert store in xm.remove_staged_stores()  # with any an earlier test left in this process
    assert not list(tmp_path.iterdir())  # the store and its owner file
    np.testing.assert_allclose(median.values, np.median(data.values, axis=0))
    assert xm.remove_staged_stores() == []
    # computed again after its store is gone: an error, where zarr read the fill value (NaN)
    with pytest.raises(xm.MemchunkError, match=r"staged data this result reads .* was removed"):
        staged.compute()


PROBE_SCRIPT = """\
import os, sys, time
from xarray_memchunk.operators import staging
def stuck(fd):  # the probe's data is written: say so, and wait to be killed
    print("syncing", flush=True)
    time.sleep(60)
os.fsync = stuck
staging.disk_bandwidth({directory!r})
"""


def test_a_process_killed_while_it_measures_the_disk_leaves_no_file(tmp_path):
    # a script killed (SIGKILL: nothing runs after) while its disk probe is written
    directory = tmp_path / "staging"
    directory.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT.format(directory=str(directory)))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "syncing"
        child.kill()
    finally:
        child.wait(timeout=30)
        child.stdout.close()
    assert list(directory.iterdir()) == []


def test_the_disk_is_measured_where_files_cannot_be_unnamed(tmp_path, monkeypatch):
    # no O_TMPFILE (macOS, or a file system without it): a named file, removed after
    monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    fd, path = staging._unnamed_file(str(tmp_path))
    os.close(fd)
    assert path is not None and path.parent == tmp_path
    path.unlink()
    assert staging.disk_bandwidth.__wrapped__(str(tmp_path)) > 0
    assert list(tmp_path.iterdir()) == []

"""A probe process forked from the planning process: a first plan measures at once (issue 32)."""

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

import dask
import pytest

from xarray_memchunk.models import probe_environment as environment

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "fork"), reason="forks on Linux"
)


@pytest.fixture
def one_thread(monkeypatch):
    """This process seen as one with no other thread (pytest-xdist runs one)."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(sys, "platform", "linux")


@pytest.fixture
def cache(tmp_path):
    """An environment with no facts kept yet."""
    with dask.config.set({"memchunk.cache-dir": str(tmp_path)}):
        yield tmp_path


def _script(script: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``script`` with ``python -c``: a plain script, one thread, forking its probes."""
    command = [sys.executable, "-c", script, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)


def _forks(setting: str) -> bool:
    with dask.config.set({"memchunk.probe-process-start": setting}):
        return environment.fork_allowed()


@linux_only
def test_auto_forks_once_a_spawned_probe_reported_its_modules(one_thread, cache):
    assert not _forks("auto")  # the first plan in an environment spawns
    environment.remember_fresh_modules(["numpy", "xarray"])
    assert environment.fresh_probe_modules() == {"numpy", "xarray"}
    assert _forks("auto") and _forks("fork")
    assert not _forks("spawn")


@linux_only
def test_no_fork_beside_another_thread_or_a_gpu_runtime(one_thread, cache, monkeypatch):
    assert _forks("fork")
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert not _forks("fork")
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "cupy", object())
    assert not _forks("fork")
    monkeypatch.delitem(sys.modules, "cupy")
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 3)  # the user froze objects
    assert not _forks("fork")


def test_a_wrong_setting_is_named(cache):
    with pytest.raises(ValueError, match=r"'threads'.*'auto', 'fork' or 'spawn'"):
        _forks("threads")


def test_import_costs_are_kept_per_set_of_modules(cache):
    environment.remember_import_bytes(["b", "a"], 1234)
    assert environment.known_import_bytes(["a", "b"]) == 1234
    assert environment.known_import_bytes(["a"]) is None
    environment.environment_file().write_text("{not json")
    assert environment.known_import_bytes(["a", "b"]) is None
    assert environment.fresh_probe_modules() is None


SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import dask, numpy as np, pandas as pd, xarray as xr
    import flox  # this process has it, as after an earlier groupby
    import xarray_memchunk
    from xarray_memchunk.errors import MeasuringWorkerDiedError
    from xarray_memchunk.models import load_calibration, probe_process

    forks = []
    real = probe_process._ForkedChild.__init__
    def counted(self):
        real(self)
        forks.append(self.pid)
    probe_process._ForkedChild.__init__ = counted

    @xarray_memchunk.operator(xarray=True, whole=["time"])
    def monthly(a):
        print("a line of the function's own")  # not into the probe's answers
        return a.groupby("time.month").mean()

    time = pd.date_range("2000-01-01", periods=730, freq="D")
    data = np.random.default_rng(0).random((730, 40, 50), dtype="float32")
    tas = xr.DataArray(data, dims=("time", "lat", "lon"), coords={"time": time})
    with dask.config.set({"memchunk.probe-process-start": "fork"}):
        plan = tas.chunk(time=30).memchunk.plan(monthly, memory_limit="2GB")
    fit = load_calibration(monthly.calibration, "cpu", "float32").metadata["fit"]
    rise = fit["resident_after_bytes"] - fit["resident_before_bytes"]

    with probe_process.ProbeProcess(start="fork") as probe:
        try:
            probe.submit(os._exit, 3)
            died = None
        except MeasuringWorkerDiedError as exc:
            died = str(exc)
    print(json.dumps({"forks": len(forks), "rise": rise, "died": died,
                      "chunks": dict(plan.chunks)}))
    """
)  # a plain script: no __main__ guard, a function of its own


@linux_only
def test_a_forked_probe_counts_the_imports_this_process_had(tmp_path):
    # flox brings numba: about 80 MiB that a worker holds once it has grouped. This process
    # imported flox before planning, so the forked probe's runs did not: the rise recorded
    # must still hold it (measured in a spawned probe), or plans would count 80 MiB short
    env = {**os.environ, "DASK_MEMCHUNK__CACHE_DIR": str(tmp_path / "cache")}
    env["MEMCHUNK_CALIBRATION_DIR"] = str(tmp_path / "calibrations")
    done = _script(SCRIPT, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["forks"] == 2  # the calibration's probe, and the one that died
    assert result["rise"] > 50 * 2**20
    assert "exit code 3" in result["died"]
    assert "a line of the function's own" in done.stderr
    facts = json.loads(next((tmp_path / "cache").glob("probe-environment-*.json")).read_text())
    (flox_set,) = [k for k in facts["import_bytes"] if "flox.core" in k.split(",")]
    assert facts["import_bytes"][flox_set] > 50 * 2**20


FINALIZER = textwrap.dedent(
    """
    import gc, os, sys
    from xarray_memchunk.models import probe_process, profiling

    class Buffered:
        \"\"\"Garbage that writes when it is collected, as a file object flushes its buffer.\"\"\"
        def __init__(self, path):
            self.path, self.me = path, self  # a cycle: only a collection frees it
        def __del__(self):
            with open(self.path, "a") as out:
                out.write(f"{os.getpid()}\\n")

    gc.disable()  # garbage still, as the fork starts
    Buffered(sys.argv[1])
    with probe_process.ProbeProcess(start="fork") as probe:
        probe.submit(profiling.freeze_heap).result()
        probe.submit(gc.collect).result()
        probe.submit(profiling.thaw_heap).result()
        child = probe._process.pid
    gc.enable()
    gc.collect()
    print(os.getpid(), child)
    """
)


@linux_only
def test_a_forked_probe_never_finalizes_what_this_process_holds(tmp_path):
    # the fork's collections must not run this process's finalizers: a file object collected
    # there would write its buffer once in the probe and again here
    written = tmp_path / "written.txt"
    done = _script(FINALIZER, str(written))
    assert done.returncode == 0, done.stderr[-3000:]
    parent, child = done.stdout.split()
    assert written.read_text().split() == [parent] != [child]

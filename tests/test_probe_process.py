"""The probe process kept between calibrations: a second plan measures at once (issue 32)."""

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import dask
import pytest

from xarray_memchunk.models import probe_process
from xarray_memchunk.models.probe_process import close_kept_probe_process, kept_probe_process


@pytest.fixture(autouse=True)
def none_kept():
    """Each test starts and ends without a kept probe process."""
    close_kept_probe_process()
    yield
    close_kept_probe_process()


def _gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (and been reaped) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_next_call_finds_the_process_the_first_started():
    with kept_probe_process() as first:
        pid = first.submit(os.getpid).result()
    with kept_probe_process() as again:
        assert again is first
        assert again.submit(os.getpid).result() == pid != os.getpid()


def test_a_process_that_died_is_replaced():
    with kept_probe_process() as first:
        pid = first.submit(os.getpid).result()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while first.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with kept_probe_process() as again:
        assert again is not first
        assert again.submit(os.getpid).result() != pid


def test_a_call_that_raised_closes_the_process():
    with pytest.raises(KeyboardInterrupt), kept_probe_process() as first:
        pid = first.submit(os.getpid).result()
        raise KeyboardInterrupt  # between a request and its answer, the protocol is lost
    assert not first.alive()
    assert _gone(pid)
    with kept_probe_process() as again:
        assert again is not first


def test_a_second_thread_gets_a_process_of_its_own():
    seen = []

    def beside() -> None:
        with kept_probe_process() as other:
            seen.append((other, other.submit(os.getpid).result()))

    with kept_probe_process() as first:
        pid = first.submit(os.getpid).result()
        thread = threading.Thread(target=beside)
        thread.start()
        thread.join()
    ((other, other_pid),) = seen
    assert other is not first and other_pid != pid
    assert not other.alive()  # closed after its caller
    assert first.alive()


def test_the_process_exits_after_the_idle_seconds():
    with dask.config.set({"memchunk.probe-process-idle-seconds": 0.3}):
        with kept_probe_process() as first:
            pid = first.submit(os.getpid).result()
        assert _gone(pid)
        with kept_probe_process() as again:
            assert again is not first


def test_none_is_kept_at_zero_idle_seconds():
    with dask.config.set({"memchunk.probe-process-idle-seconds": 0}):
        with kept_probe_process() as first:
            pid = first.submit(os.getpid).result()
        assert not first.alive()
        assert _gone(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_process_exits_with_the_script_that_started_it():
    script = textwrap.dedent(
        """
        import os
        from xarray_memchunk.models.probe_process import kept_probe_process

        with kept_probe_process() as probe:
            print(probe.submit(os.getpid).result(), flush=True)
        """
    )  # a plain script: no __main__ guard, the process kept when it ends
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    child = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":  # exited; its parent, gone, left it to init to reap
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the probe process {child} outlived the script that started it")


def test_a_package_of_the_same_name_in_the_working_directory_is_not_imported(tmp_path, monkeypatch):
    shadow = tmp_path / "xarray_memchunk"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the shadowing checkout')\n")
    monkeypatch.chdir(tmp_path)
    with kept_probe_process() as probe:
        assert probe.submit(os.getcwd).result() == str(tmp_path)


def test_a_module_edited_since_the_process_started_gets_a_new_process(tmp_path, monkeypatch):
    module = tmp_path / "probe_edited_module.py"
    module.write_text("def version():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    edited = importlib.import_module("probe_edited_module")
    try:
        with kept_probe_process() as first:
            assert first.submit(edited.version).result() == 1
        module.write_text("def version():\n    return 2\n")
        later = time.time() + 5  # a file system's coarse clock: clearly after the start
        os.utime(module, (later, later))
        edited = importlib.reload(edited)
        with kept_probe_process() as again:
            assert again is not first
            assert again.submit(edited.version).result() == 2
        assert not first.alive()
    finally:  # its file, dated ahead, would renew every later test's process
        sys.modules.pop("probe_edited_module", None)


def test_a_changed_path_gets_a_new_process(tmp_path, monkeypatch):
    with kept_probe_process() as first:
        first.submit(os.getpid).result()
    monkeypatch.syspath_prepend(str(tmp_path))
    with kept_probe_process() as again:
        assert again is not first
        assert str(tmp_path) in again.submit(lambda: __import__("sys").path).result()


def test_an_interrupted_request_closes_the_process(monkeypatch):
    with kept_probe_process() as first:
        first.submit(os.getpid).result()

    def interrupted(stream):
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_process, "_receive", interrupted)
    with pytest.raises(KeyboardInterrupt), kept_probe_process() as again:
        assert again is first
        again.submit(os.getpid)
    assert not first.alive()


def test_a_module_in_the_working_directory_of_a_command_line_script(tmp_path):
    (tmp_path / "probe_cwd_module.py").write_text("def answer():\n    return 42\n")
    script = textwrap.dedent(
        """
        import probe_cwd_module
        from xarray_memchunk.models.probe_process import kept_probe_process

        with kept_probe_process() as probe:
            print(probe.submit(probe_cwd_module.answer).result())
        """
    )  # python -c: "" on sys.path, the working directory
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "42"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_forked_copy_does_not_use_the_kept_process():
    with kept_probe_process() as first:
        first.submit(os.getpid).result()
    pid = os.fork()
    if pid == 0:  # the copy: no kept process, its own lock free
        kept = probe_process._Kept
        os._exit(0 if kept.probe is None and kept.lock.acquire(blocking=False) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with kept_probe_process() as again:
        assert again is first and again.alive()

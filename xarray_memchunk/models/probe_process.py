"""A child process to measure tasks in, started without re-importing the user's script.

Measuring a task's memory needs a process of its own: the caller's process holds the user's
data and whatever else it made. A ``LocalCluster`` of processes starts its workers with
multiprocessing, which imports the user's ``__main__`` again in each of them: a plain script
without an ``if __name__ == "__main__":`` guard then starts clusters recursively and fails
("Nanny failed to start"). This child is started as ``python -m`` this module instead: it
imports nothing of the caller's script, and receives each call shipped by value with
cloudpickle (functions defined in ``__main__`` included), as Dask ships tasks.

Starting the child costs its imports (xarray, Dask: 1.5-2.3 s of a first plan's
self-calibration on a 2-core machine). :func:`kept_probe_process` keeps one child between
calibrations, so that a second plan (another function, other arguments) starts measuring at
once; it exits after :data:`IDLE_SECONDS` without a calibration, or with this process. On
Linux, where it is safe (:func:`~xarray_memchunk.models.probe_environment.fork_allowed`),
a probe is forked from this process instead (``ProbeProcess(start="fork")``): it has
everything imported, and the modules it did not import for the operator are accounted for
(:mod:`~xarray_memchunk.models.probe_environment`).

The protocol is private to this module: length-prefixed cloudpickle frames on the child's
stdin and a duplicate of its stdout (the child's own ``print`` goes to stderr). Only frames
this process wrote are ever unpickled, on either side.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from .profiling import FORKED_WITH_FROZEN_HEAP

__all__ = ["ProbeProcess", "close_kept_probe_process", "kept_probe_process"]

_HEADER = struct.Struct("!Q")


def _send(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream: BinaryIO) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    return stream.read(length)


class _Done:
    """A finished call, shaped like a ``distributed.Future`` for :func:`profile_in_worker`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        """The call's return value."""
        return self.value


class ProbeProcess:
    """A Python child process that runs calls one at a time, for measuring them.

    Used as a context manager; it answers the two calls profiling makes of a
    ``distributed.Client`` (``scheduler_info`` and ``submit(...).result()``), so it can stand
    in for a one-worker, one-thread cluster.

    Raises
    ------
    CalibrationError
        From :meth:`submit`, when the call failed in the child (with its error);
        :class:`~xarray_memchunk.errors.MeasuringWorkerDiedError` when the child died (memory,
        a signal).
    """

    def __init__(self, start: str = "spawn") -> None:
        if start not in ("spawn", "fork"):
            raise ValueError(f"start is {start!r}: use 'spawn' or 'fork'")
        self.start = start
        self._process: subprocess.Popen | _ForkedChild | None = None
        self._started = 0.0  # time.time() when the child was started
        self._path: list[str] = []  # this process's sys.path then

    def __enter__(self) -> ProbeProcess:
        self._started, self._path = time.time(), list(sys.path)
        if self.start == "fork":
            self._process = _ForkedChild()
            return self
        env = dict(os.environ)
        # this process's path, its working directory last where the path names it ("": python
        # -c, the REPL); -P below keeps the child's own working directory off it
        path = [p for p in sys.path if p] + ([os.getcwd()] if "" in sys.path else [])
        env["PYTHONPATH"] = os.pathsep.join(path)
        self._process = subprocess.Popen(
            # -P: the working directory is not put first on the path, where a checkout of
            # another version (or a module of the same name) would shadow the caller's import
            [sys.executable, "-P", "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        # the child now exits, tearing down what it imported (~0.5 s): not waited for here
        threading.Thread(target=_reap, args=(process,), name="memchunk-probe-exit").start()

    def alive(self) -> bool:
        """Whether the child is started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def imports_as_started(self) -> bool:
        """Whether the child imports what this process would now.

        False where this process's ``sys.path`` changed since the child was started, or where
        the file of a module this process imported changed since (an edited function, reloaded
        here: the child would run the code it imported first). Modules under the interpreter's
        prefixes (the standard library, site-packages) are not looked at. The environment is
        not compared: libraries set variables as they are imported (scikit-learn,
        ``KMP_DUPLICATE_LIB_OK``); the child keeps this process's environment at its start.
        """
        if sys.path != self._path:
            return False
        prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or file.startswith(prefixes):
                continue
            try:
                if os.stat(file).st_mtime > self._started:
                    return False
            except OSError:
                continue
        return True

    def scheduler_info(self) -> dict[str, Any]:
        """One worker, as a one-worker cluster's scheduler would describe it."""
        return {"workers": {"probe-process": {"nthreads": 1}}}

    def submit(self, func: Callable[..., Any], *args: Any, **ignored: Any) -> _Done:
        """Run ``func(*args)`` in the child and wait for it (``pure``, ``workers`` are ignored)."""
        import cloudpickle

        from ..errors import CalibrationError, MeasuringWorkerDiedError

        if self._process is None:
            raise RuntimeError("ProbeProcess is used as a context manager")
        request = cloudpickle.dumps((func, args))
        try:
            _send(self._process.stdin, request)
            answer = _receive(self._process.stdout)
        except (BrokenPipeError, OSError):
            answer = None
        except BaseException:  # between a request and its answer: the protocol is lost
            self.__exit__(None, None, None)
            raise
        if answer is None:
            code = self._process.poll()
            raise MeasuringWorkerDiedError(
                f"the process measuring the operator died (exit code {code}): it may have run "
                f"out of memory; give the operator a memory_model, or free memory first"
            )
        ok, value = cloudpickle.loads(answer)
        if not ok:
            raise CalibrationError(f"measuring the operator failed in its process: {value}")
        return _Done(value)

    def imports_not_measured(self) -> int:
        """Bytes of imports the operator's runs used here that a fresh process would add.

        0 for a spawned probe: its runs imported what they needed. A forked probe had the
        modules this process imported; those the recorded first run used and a spawned probe
        lacks are imported in one, and what that took is returned (kept for this
        environment: :func:`~xarray_memchunk.models.probe_environment.import_rise`).
        """
        from . import probe_environment as environment

        if self.start != "fork":
            return 0
        fresh = environment.fresh_probe_modules() or frozenset()
        missing = [m for m in self.submit(environment.used_modules).result() if m not in fresh]
        if not missing:
            return 0
        known = environment.known_import_bytes(missing)
        if known is not None:
            return known
        with kept_probe_process(fork=False) as spawned:
            nbytes = int(spawned.submit(environment.import_rise, missing).result())
        environment.remember_import_bytes(missing, nbytes)
        return nbytes


class _ForkedChild:
    """A fork of this process serving calls on two pipes: what a ProbeProcess uses of a Popen."""

    def __init__(self) -> None:
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # not written twice, by the child too
            with contextlib.suppress(Exception):
                stream.flush()
        # this process's objects frozen as it forks: the child never collects them (their
        # finalizers would run twice: a file's buffer written twice), and its collections
        # leave their pages shared (the gc.freeze documentation's advice)
        gc.freeze()  # none were frozen before (fork_allowed)
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            for end in (requests_read, requests_write, answers_read, answers_write):
                os.close(end)
            raise
        if pid != 0:
            gc.unfreeze()
        if pid == 0:  # the child: serve, then leave without this process's exit handlers
            code = 1
            try:
                FORKED_WITH_FROZEN_HEAP.set()
                os.close(requests_write)
                os.close(answers_read)
                os.dup2(2, 1)  # the calls' own output goes to stderr, as a spawned child's
                _serve(os.fdopen(requests_read, "rb"), os.fdopen(answers_write, "wb"), True)
                code = 0
            finally:
                os._exit(code)
        os.close(requests_read)
        os.close(answers_write)
        self.pid, self.returncode = pid, None
        self.stdin, self.stdout = os.fdopen(requests_write, "wb"), os.fdopen(answers_read, "rb")

    def poll(self) -> int | None:
        """The child's exit code, None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its code unknown
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"probe process {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        """Kill the child."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


#: Seconds a kept probe process waits for its next calibration before it exits; the dask
#: config key ``memchunk.probe-process-idle-seconds`` sets it (0: not kept).
IDLE_SECONDS = 300.0


class _Kept:
    """The probe process kept between calibrations, and who may use it (one caller at a time)."""

    lock = threading.Lock()
    probe: ProbeProcess | None = None
    timer: threading.Timer | None = None


@contextlib.contextmanager
def kept_probe_process(fork: bool = True) -> Iterator[ProbeProcess]:
    """A probe process started on first use and kept for the next calibration.

    With ``fork``, where forking is allowed
    (:func:`~xarray_memchunk.models.probe_environment.fork_allowed`), a probe forked from
    this process for this calibration instead (it starts at once, and sees what this
    process defined since); else, after its use, a spawned probe reports the modules it
    started with, once per environment.

    The child is kept where the block ran through: a call that raised (the child died, a
    measurement failed, the caller was interrupted between a request and its answer) closes
    it, and the next call starts another, as it does where the child would not import what
    this process imports now (:meth:`ProbeProcess.imports_as_started`). While one caller uses
    it, another (a second thread) gets a probe process of its own, closed after it. A child
    forked from this process starts its own. The child exits after
    ``memchunk.probe-process-idle-seconds`` (:data:`IDLE_SECONDS`) without a call, when
    :func:`close_kept_probe_process` is called, or when this process exits (its input, a
    pipe from this process, then ends).
    """
    import dask

    from . import probe_environment as environment

    forked = ProbeProcess(start="fork") if fork and environment.fork_allowed() else None
    with contextlib.suppress(OSError):  # the system refused a fork (memory): one is spawned
        forked = forked.__enter__() if forked is not None else None
    if forked is not None and forked.alive():
        try:
            yield forked
        finally:
            forked.__exit__(None, None, None)
        return
    idle = float(dask.config.get("memchunk.probe-process-idle-seconds", IDLE_SECONDS))
    if idle <= 0 or not _Kept.lock.acquire(blocking=False):
        with ProbeProcess() as own:
            yield own
        return
    try:
        _cancel_idle_timer()
        if _Kept.probe is None or not _Kept.probe.alive() or not _Kept.probe.imports_as_started():
            _close_kept()
            _Kept.probe = ProbeProcess().__enter__()
        try:
            yield _Kept.probe
        except BaseException:
            _close_kept()
            raise
        alive = _Kept.probe is not None and _Kept.probe.alive()
        if alive and environment.fresh_probe_modules() is None:
            started = _Kept.probe.submit(environment.modules_at_start).result()
            environment.remember_fresh_modules(started)
        if _Kept.probe is not None and _Kept.probe.alive():
            _Kept.timer = threading.Timer(idle, _close_when_idle)
            _Kept.timer.daemon = True
            _Kept.timer.start()
        else:
            _close_kept()
    finally:
        _Kept.lock.release()


def close_kept_probe_process() -> None:
    """Close the kept probe process (:func:`kept_probe_process`), waiting for a caller using it."""
    with _Kept.lock:
        _cancel_idle_timer()
        _close_kept()


def _cancel_idle_timer() -> None:
    """Stop the kept probe process's idle timer, if one runs (the caller holds the lock)."""
    if _Kept.timer is not None:
        _Kept.timer.cancel()
        _Kept.timer = None


def _close_when_idle() -> None:
    """The idle timer's end: close the kept probe process unless a caller is using it."""
    if _Kept.lock.acquire(blocking=False):
        try:
            _Kept.timer = None
            _close_kept()
        finally:
            _Kept.lock.release()


def _close_kept() -> None:
    """Close the kept probe process, if any (the caller holds :attr:`_Kept.lock`)."""
    probe, _Kept.probe = _Kept.probe, None
    if probe is not None:
        probe.__exit__(None, None, None)


def _forget_in_a_forked_child() -> None:
    """In a child forked from this process: no kept probe process, its pipes closed here."""
    probe, _Kept.probe = _Kept.probe, None
    process = probe._process if probe is not None else None
    if process is not None:
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        probe._process = None
    _Kept.lock, _Kept.timer = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_a_forked_child)


def _reap(process: subprocess.Popen) -> None:
    """Wait for a child whose input is closed to exit (killed after 10 s), then close its pipe."""
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    finally:
        process.stdout.close()


def _serve(requests: BinaryIO, protocol: BinaryIO, forked: bool = False) -> None:
    """The child's loop: run each call received, send back its result or its error.

    ``forked``: the modules that calls use are recorded until a block has been measured
    (:func:`~xarray_memchunk.models.probe_environment.record_used_modules`).
    """
    import traceback

    import cloudpickle

    from . import probe_environment as environment
    from .profiling import measure_device_peak, measure_peak

    environment._AT_START[:] = sorted(sys.modules)
    recording = forked
    while (frame := _receive(requests)) is not None:
        watch = environment.record_used_modules() if recording else contextlib.nullcontext()
        try:
            with watch:
                func, args = cloudpickle.loads(frame)
                answer = (True, func(*args))
            recording = recording and func not in (measure_peak, measure_device_peak)
        except Exception as exc:  # the caller raises it as a CalibrationError
            answer = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        _send(protocol, cloudpickle.dumps(answer))


if __name__ == "__main__":
    _answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the calls' own output goes to stderr, never into the protocol
    _serve(sys.stdin.buffer, _answers)

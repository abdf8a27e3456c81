"""A child process to measure tasks in, started without re-importing the user's script.

Measuring a task's memory needs a process of its own: the caller's process holds the user's
data and whatever else it made. A ``LocalCluster`` of processes starts its workers with
multiprocessing, which imports the user's ``__main__`` again in each of them: a plain script
without an ``if __name__ == "__main__":`` guard then starts clusters recursively and fails
("Nanny failed to start"). This child is started as ``python -m`` this module instead: it
imports nothing of the caller's script, and receives each call shipped by value with
cloudpickle (functions defined in ``__main__`` included), as Dask ships tasks.

Starting the child costs its imports (xarray, Dask: 1.2-1.7 s of a first plan's
self-calibration on a 2-core machine). :func:`kept_probe_process` keeps one child between
calibrations, so that a second plan (another function, other arguments) starts measuring at
once; it exits after :data:`IDLE_SECONDS` without a calibration, or with this process.

The protocol is private to this module: length-prefixed cloudpickle frames on the child's
stdin and a duplicate of its stdout (the child's own ``print`` goes to stderr). Only frames
this process wrote are ever unpickled, on either side.
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

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

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._started = 0.0  # time.time() when the child was started
        self._path: list[str] = []  # this process's sys.path then

    def __enter__(self) -> ProbeProcess:
        self._started, self._path = time.time(), list(sys.path)
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


#: Seconds a kept probe process waits for its next calibration before it exits; the dask
#: config key ``memchunk.probe-process-idle-seconds`` sets it (0: not kept).
IDLE_SECONDS = 300.0


class _Kept:
    """The probe process kept between calibrations, and who may use it (one caller at a time)."""

    lock = threading.Lock()
    probe: ProbeProcess | None = None
    timer: threading.Timer | None = None


@contextlib.contextmanager
def kept_probe_process() -> Iterator[ProbeProcess]:
    """A probe process started on first use and kept for the next calibration.

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


def _serve() -> None:
    """The child's loop: run each call received, send back its result or its error."""
    import traceback

    import cloudpickle

    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the calls' own output goes to stderr, never into the protocol
    requests = sys.stdin.buffer
    while (frame := _receive(requests)) is not None:
        try:
            func, args = cloudpickle.loads(frame)
            answer = (True, func(*args))
        except Exception as exc:  # the caller raises it as a CalibrationError
            notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))
            headline = f"{type(exc).__name__}: {exc}{notes}"
            trace = traceback.format_exc(limit=3).replace(notes.lstrip("\n"), "").rstrip()
            answer = (False, f"{headline}\n{trace}")
        _send(protocol, cloudpickle.dumps(answer))


if __name__ == "__main__":
    _serve()

"""A child process to measure tasks in, started without re-importing the user's script.

Measuring a task's memory needs a process of its own: the caller's process holds the user's
data and whatever else it made. A ``LocalCluster`` of processes starts its workers with
multiprocessing, which imports the user's ``__main__`` again in each of them: a plain script
without an ``if __name__ == "__main__":`` guard then starts clusters recursively and fails
("Nanny failed to start"). This child is started as ``python -m`` this module instead: it
imports nothing of the caller's script, and receives each call shipped by value with
cloudpickle (functions defined in ``__main__`` included), as Dask ships tasks.

The protocol is private to this module: length-prefixed cloudpickle frames on the child's
stdin and a duplicate of its stdout (the child's own ``print`` goes to stderr). Only frames
this process wrote are ever unpickled, on either side.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

__all__ = ["ProbeProcess", "ready_since"]

#: ``time.monotonic()`` when this process, a probe process, began serving calls; None elsewhere.
_SERVING_SINCE: float | None = None


def ready_since() -> float:
    """When this process could first run a call, on the system's monotonic clock.

    A probe process: when it began serving (its imports done), whether or not a call came
    then. Any other process (a cluster's worker): now, as a call sent while it was still
    starting runs once it can.
    """
    return _SERVING_SINCE if _SERVING_SINCE is not None else time.monotonic()


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

    def __enter__(self) -> ProbeProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__],
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

    def scheduler_info(self) -> dict[str, Any]:
        """One worker, as a one-worker cluster's scheduler would describe it."""
        return {"workers": {"probe-process": {"nthreads": 1}}}

    def submit(self, func: Callable[..., Any], *args: Any, **ignored: Any) -> _Done:
        """Run ``func(*args)`` in the child and wait for it (``pure``, ``workers`` are ignored)."""
        import cloudpickle

        from ..errors import CalibrationError, MeasuringWorkerDiedError

        if self._process is None:
            raise RuntimeError("ProbeProcess is used as a context manager")
        try:
            _send(self._process.stdin, cloudpickle.dumps((func, args)))
            answer = _receive(self._process.stdout)
        except (BrokenPipeError, OSError):
            answer = None
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
    import importlib
    import traceback

    import cloudpickle

    # run as ``python -m``, this is ``__main__``: the calls find the module by its name
    importlib.import_module(__spec__.name)._SERVING_SINCE = time.monotonic()
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the calls' own output goes to stderr, never into the protocol
    requests = sys.stdin.buffer
    while (frame := _receive(requests)) is not None:
        try:
            func, args = cloudpickle.loads(frame)
            answer = (True, func(*args))
        except Exception as exc:  # the caller raises it as a CalibrationError
            answer = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        _send(protocol, cloudpickle.dumps(answer))


if __name__ == "__main__":
    _serve()

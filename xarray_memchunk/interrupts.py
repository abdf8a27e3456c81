"""How the ``memchunk`` command ends on Ctrl-C (SIGINT) or SIGTERM: one line, 128 + the signal.

The handler raises :class:`Interrupted` in the main thread, as Ctrl-C raises
``KeyboardInterrupt``: the command stops its cluster, removes its partial output and says so in
one line (:func:`report`). Two things can keep that from happening: a library's bare ``except:``
that catches the exception where the signal landed (the command then goes on), and a cluster
that does not stop (a lock held where the exception cut in, a worker that does not answer). CI
once waited over 60 s for a command interrupted while its worker ran a 60 s task. So an
interrupt also starts a deadline: :data:`STOP_DEADLINE_S` later, whatever the main thread is
doing, the command's child processes (its LocalCluster's workers) are killed, the output being
written is recovered (:func:`xarray_memchunk.io.recover`), the line written, and the process
ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "INTERRUPTS",
    "STOP_DEADLINE_S",
    "Interrupted",
    "handled",
    "identity",
    "quiet_resource_tracker",
    "recovering",
    "report",
    "writing",
]

#: Signals that end a command cleanly: partial output removed, one line, 128 + the number.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
#: Seconds an interrupted command waits for its cluster to stop before it kills the cluster's
#: processes and ends. A worker stopped by its nanny takes at most 9 s (5 s to close, then
#: 4 s after SIGTERM: ``distributed.nanny.WorkerProcess.kill``); from a task that runs on,
#: 4.6 s was measured. A batch system's SIGKILL follows its SIGTERM after 30 s (Slurm's
#: default ``KillWait``).
STOP_DEADLINE_S = 15.0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM received: the command ends, its partial output removed.

    Parameters
    ----------
    signum
        The signal's number.
    stderr
        A file descriptor of the command's stderr, kept for the one line that says so: fd 2
        itself is silenced, so that the shutdown of a cluster cut short prints nothing more.
    """

    def __init__(self, signum: int, stderr: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.stderr = stderr


class _Output:
    """The output a command is writing, for the deadline to recover: one per process."""

    path: str | None = None
    before: tuple[int, int] | None = None
    lock = threading.Lock()  # held while the output is recovered: by one thread at a time
    status: int | None = None  # the exit status, once the interrupt was reported


def identity(path: str) -> tuple[int, int] | None:
    """``path``'s device and inode, None where it does not exist.

    A new output is another file or directory (written beside the old one, then swapped in):
    its inode differs, where an old one moved aside and back keeps its own.
    """
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """While in it, ``path`` is the output an interrupt's deadline recovers."""
    _Output.path, _Output.before = path, identity(path)
    try:
        yield
    finally:
        _Output.path = None


@contextlib.contextmanager
def recovering() -> Iterator[None]:
    """Hold while recovering the output: the deadline waits for it, then recovers no more."""
    with _Output.lock:
        yield


def _written(path: str | None, before: tuple[int, int] | None) -> str | None:
    """``path`` where a new output is in place there (not the one found at the start)."""
    if path is None or identity(path) in (None, before):
        return None
    return path


def report(exc: KeyboardInterrupt, written: str | None = None, why: str = "") -> int:
    """Say in one line that the command was interrupted; its exit status, 128 + the signal.

    Parameters
    ----------
    exc
        The interrupt: an :class:`Interrupted`, or a plain ``KeyboardInterrupt`` (SIGINT).
    written
        The output, where it was in place before the interrupt: said so, not removed.
    why
        What was done beyond the usual, said first.
    """
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    what = (
        f"{written} had been written whole before it"
        if written
        else "nothing more written, partial output removed"
    )
    line = f"memchunk: interrupted by {signal.Signals(signum).name}: {why}{what}\n"
    if isinstance(exc, Interrupted):
        os.write(exc.stderr, line.encode())
    else:
        sys.stderr.write(line)
    _Output.status = 128 + signum
    return _Output.status


def _kill_children() -> None:
    """SIGKILL every process this one started, and theirs: nothing of them writes any more."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def _end_at_deadline(exc: Interrupted, deadline_s: float) -> None:
    """After ``deadline_s``, stop this process's children, recover its output and end it."""
    from .io import recover

    time.sleep(deadline_s)  # a daemon thread: it ends with the process, if that is earlier
    _kill_children()
    if _Output.status is not None:  # said, but the exit hangs (a thread, an exit handler)
        os._exit(_Output.status)
    path, before = _Output.path, _Output.before
    if path is not None and _Output.lock.acquire(timeout=deadline_s):
        with contextlib.suppress(OSError):
            recover(path)
    why = f"its cluster had not stopped {deadline_s:.0f} s later and was killed; "
    os._exit(report(exc, written=_written(path, before), why=why))


def _interrupt(signum: int, frame: object) -> None:
    """End the command as Ctrl-C does; ignore further interrupts while it cleans up."""
    for interrupt in INTERRUPTS:
        signal.signal(interrupt, signal.SIG_IGN)
    sys.stderr.flush()
    stderr = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    exc = Interrupted(signum, stderr)
    deadline = threading.Thread(
        target=_end_at_deadline, args=(exc, STOP_DEADLINE_S), name="memchunk-deadline"
    )
    deadline.daemon = True
    deadline.start()
    raise exc


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Handle :data:`INTERRUPTS` while in it; the caller's handlers are given back after."""
    previous: dict[int, Callable[..., Any] | int | None] = {
        interrupt: signal.getsignal(interrupt) for interrupt in INTERRUPTS
    }
    for interrupt in INTERRUPTS:  # first: an interrupt at any later moment ends cleanly
        signal.signal(interrupt, _interrupt)
    try:
        yield
    finally:  # a caller in Python (a notebook) gets its own handlers back
        for interrupt, handler in previous.items():
            signal.signal(interrupt, handler)


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its stderr silenced, if not yet running.

    The tracker is a process of its own, which writes to the stderr it started with. A
    command interrupted while its LocalCluster started a worker leaves the semaphore of
    that worker's start queue registered; the tracker then warned of it in 4 lines after the
    command's one (1 in 10 runs). It tracks nothing the command's user can act on.
    """
    from multiprocessing import resource_tracker

    sys.stderr.flush()
    kept = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(kept, 2)
        os.close(kept)
        os.close(devnull)

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
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "INTERRUPTS",
    "STOP_DEADLINE_S",
    "Interrupted",
    "handled",
    "identity",
    "new_output",
    "quiet_resource_tracker",
    "received",
    "recovering",
    "report",
    "writing",
]

#: Signals that end a command cleanly: partial output removed, one line, 128 + the number.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
#: Seconds an interrupted command waits for its cluster to stop before it kills the cluster's
#: processes. A worker stopped by its nanny takes at most 9 s (5 s to close, then 4 s after
#: SIGTERM: ``distributed.nanny.WorkerProcess.kill``); from a task that runs on, 4.6 s was
#: measured (50 runs under load: at most 5.5 s). With :data:`RECOVERY_WAIT_S` twice, the
#: command ends within 20 s, before a batch system's SIGKILL (Slurm's ``KillWait``: 30 s).
STOP_DEADLINE_S = 10.0


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


class _Command:
    """One command's interrupt state, from :func:`handled`'s start to its end.

    ``lock`` is held while the output is recovered and while the line is written, by the main
    thread or the deadline, so that the deadline never cuts a recovery short nor says a
    second line.
    """

    def __init__(self) -> None:
        sys.stderr.flush()
        self.stderr = os.dup(2)  # the real stderr, whatever fd 2 is when a signal comes
        self.lock = threading.RLock()
        self.ended = threading.Event()  # set when the command returns: no deadline then
        self.received: Interrupted | None = None
        self.silenced = False
        self.path: str | None = None
        self.before: tuple[int, int] | None = None
        self.recovered = False
        self.status: int | None = None

    def close(self, exiting: bool) -> None:
        """Cancel the deadline; give fd 2 back where an interrupt silenced it.

        Not where the process is ``exiting``: a cluster cut short by the interrupt prints a
        traceback as the interpreter ends (distributed's ``SpecCluster._close``: 29 lines in
        17 of 20 runs interrupted while the cluster started).
        """
        self.ended.set()
        with self.lock:
            if self.silenced and not exiting:
                os.dup2(self.stderr, 2)
            os.close(self.stderr)


_command: _Command | None = None


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
    """While in it, ``path`` is the output an interrupt's deadline recovers.

    Stay in it until the output is recovered (:func:`recovering`).
    """
    command = _command
    if command is None:  # not under handled(): no interrupt of ours to end
        yield
        return
    command.path, command.before, command.recovered = path, identity(path), False
    try:
        yield
    finally:
        command.path = None


@contextlib.contextmanager
def recovering() -> Iterator[None]:
    """Hold while recovering the output: the deadline waits for it, then recovers no more."""
    command = _command
    if command is None:
        yield
        return
    with command.lock:
        yield
        command.recovered = True


def received() -> Interrupted | None:
    """The interrupt this command received, where one did: a library may have caught it."""
    return _command.received if _command is not None else None


def new_output(path: str | None, before: tuple[int, int] | None) -> str | None:
    """``path`` where a new output is in place there (not the one of identity ``before``)."""
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
    command = _command
    with command.lock if command is not None else contextlib.nullcontext():
        if command is not None and command.status is not None:
            return command.status  # said already (by the deadline, or once before)
        if isinstance(exc, Interrupted):
            os.write(exc.stderr, line.encode())
        else:
            sys.stderr.write(line)
        if command is not None:
            command.status = 128 + signum
    return 128 + signum


def _kill_children() -> int:
    """SIGKILL every process this one started, and theirs; how many there were."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    return len(children)


#: Seconds the deadline, once it has killed the cluster's processes, waits for the main thread
#: to end the command itself (its cluster's close returns once they are gone), and then for a
#: recovery of the output under way.
RECOVERY_WAIT_S = 5.0


def _end_at_deadline(command: _Command, exc: Interrupted, deadline_s: float) -> None:
    """After ``deadline_s``, stop this process's children, recover its output and end it.

    Nothing, where the command returned before (:meth:`_Command.close`).
    """
    from .io import recover

    if command.ended.wait(deadline_s):
        return
    killed = _kill_children()
    if command.ended.wait(RECOVERY_WAIT_S):  # the main thread, unblocked, ended it
        return
    if not command.lock.acquire(timeout=RECOVERY_WAIT_S):  # a recovery that does not end
        os._exit(128 + exc.signum)
    if command.ended.is_set():
        command.lock.release()
        return
    if command.status is not None:  # said: the rest of the way out is what hangs
        os._exit(command.status)
    path, before = command.path, command.before
    if path is not None and not command.recovered:
        with contextlib.suppress(OSError):
            recover(path)
    stopped = f"its {killed} cluster process(es) were killed" if killed else "it was ended"
    why = f"it had not stopped {deadline_s:.0f} s later and {stopped}; "
    os._exit(report(exc, written=new_output(path, before), why=why))


def _interrupt(signum: int, frame: object) -> None:
    """End the command as Ctrl-C does; ignore further interrupts while it cleans up."""
    for interrupt in INTERRUPTS:
        signal.signal(interrupt, signal.SIG_IGN)
    command = _command
    if command is None:  # pragma: no cover (installed only by handled())
        raise KeyboardInterrupt
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    command.silenced = True
    exc = Interrupted(signum, command.stderr)
    command.received = exc
    deadline = threading.Thread(
        target=_end_at_deadline,
        args=(command, exc, STOP_DEADLINE_S),
        name="memchunk-deadline",
        daemon=True,
    )
    deadline.start()
    raise exc


@contextlib.contextmanager
def handled(exiting: bool = False) -> Iterator[None]:
    """Handle :data:`INTERRUPTS` while in it; the caller's handlers are given back after.

    An interrupt starts a deadline (:data:`STOP_DEADLINE_S`) that ends the process unless
    the command returns first; a caller in Python goes on as before once it has, its stderr
    given back. Where the process ends after it (``exiting``: the ``memchunk`` command), an
    interrupted command ends the process as it leaves: its stderr silenced, its child
    processes killed, no exit handlers run.
    """
    global _command
    previous: dict[int, Callable[..., Any] | int | None] = {
        interrupt: signal.getsignal(interrupt) for interrupt in INTERRUPTS
    }
    _command = _Command()
    for interrupt in INTERRUPTS:  # first: an interrupt at any later moment ends cleanly
        signal.signal(interrupt, _interrupt)
    try:
        yield
    finally:  # a caller in Python (a notebook) gets its own handlers back
        for interrupt, handler in previous.items():
            signal.signal(interrupt, handler)
        command, _command = _command, None
        command.close(exiting)
        if exiting and command.status is not None:
            _exit_now(command.status)


def _exit_now(status: int) -> None:
    """End an interrupted command's process at once, its child processes with it.

    Its output is recovered and its line said: what is left is distributed's clean-up of a
    cluster whose close the interrupt cut short, which waited 10 s at the interpreter's exit
    (an interrupt 7.5 s into a 10.5 s run, as its cluster closed: exit 10.4 s after it).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    _kill_children()
    os._exit(status)


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
    finally:  # fd 2 back, unless an interrupt meanwhile silenced it for good
        silenced = _command is not None and _command.silenced
        os.dup2(devnull if silenced else kept, 2)
        os.close(kept)
        os.close(devnull)

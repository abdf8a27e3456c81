"""What the workers of a command's own ``LocalCluster`` run as they start: a distributed preload.

A terminal sends Ctrl-C (SIGINT) to every process in the foreground process group: the
``memchunk`` command and the worker processes its ``LocalCluster`` started. The command ends
the cluster itself and says so in one line; each worker that took the signal printed its own
traceback as well (50 to 70 lines from 2 workers, a new user found). Its workers ignore it.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

__all__ = ["dask_setup"]


def dask_setup(worker: Any) -> None:
    """Ignore SIGINT in this worker's process: the command that started it ends it.

    Called by distributed in the worker process's main thread; elsewhere (a worker in the
    command's own process), nothing is changed.
    """
    with contextlib.suppress(ValueError):  # not the main thread: not a process of its own
        signal.signal(signal.SIGINT, signal.SIG_IGN)

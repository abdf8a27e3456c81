"""The worker plugin that measures every task's peak memory (see :mod:`xarray_memchunk.runs`).

Imported only where a ``distributed`` cluster is in use, so that importing the package does not
import ``distributed``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .models.profiling import reset_high_water_mark, status_bytes
from .runs import PLUGIN_NAME

__all__ = ["KEPT_RECORDS", "TaskPeaks"]

#: Task records a worker keeps (the oldest are dropped).
KEPT_RECORDS = 100_000


class TaskPeaks(WorkerPlugin):
    """Worker plugin: the peak memory and duration of every task a single-threaded worker runs.

    On a worker with several threads, tasks overlap and a process-wide high-water mark cannot
    be split among them: nothing is recorded there.
    """

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        """Start with no records; measure only where one task runs at a time."""
        self.records: deque[tuple[str, int, float, float]] = deque(maxlen=KEPT_RECORDS)
        self.started: dict[Any, tuple[int, float]] = {}
        self.single = getattr(worker.state, "nthreads", 1) == 1

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Reset the high-water mark when a task starts; read it when it ends."""
        if not self.single:
            return
        if finish == "executing":
            reset_high_water_mark()
            self.started[key] = (status_bytes("VmRSS"), time.perf_counter())
        elif start == "executing" and key in self.started:
            rss, began = self.started.pop(key)
            peak = max(0, status_bytes("VmHWM") - rss)
            name = key[0] if isinstance(key, tuple) else key
            self.records.append((str(name), peak, time.perf_counter() - began, time.time()))

    def since(self, moment: float) -> list[tuple[str, int, float, float]]:
        """The records of tasks that ended after ``moment`` (a ``time.time()``)."""
        return [r for r in self.records if r[3] >= moment]

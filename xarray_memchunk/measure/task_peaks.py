"""The worker plugin that measures the memory of every task (see :mod:`~.runs`).

Imported only where a ``distributed`` cluster is in use, so that importing the package does not
import ``distributed``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

from distributed.diagnostics.plugin import WorkerPlugin

from .._dask_compat import worker_stored_bytes, worker_threads
from ..models.profiling import reset_high_water_mark, status_bytes

__all__ = ["KEPT_RECORDS", "PLUGIN_NAME", "TaskPeaks", "TaskRecord", "key_name"]

#: Name of the worker plugin that measures tasks.
PLUGIN_NAME = "memchunk-task-peaks"
#: Task records a worker keeps (the oldest are dropped).
KEPT_RECORDS = 100_000


class TaskRecord(NamedTuple):
    """What a worker measured of one task.

    Attributes
    ----------
    name
        The task's key name (its layer, for an array task).
    peak_bytes
        On a single-threaded worker, the task's own peak above the memory at its start. On a
        worker with several threads, the worker's growth since its threads were last all idle
        (tasks overlap there, and a process-wide high-water mark cannot be split among them),
        less what it stores more now than then (results of finished tasks).
    seconds
        The task's duration.
    ended
        When it ended (``time.time()``).
    threads
        The worker's threads: 1 when ``peak_bytes`` is the task's own.
    overlap
        The most tasks that ran at once in that period so far (1 on a single-threaded worker):
        what ``peak_bytes`` is shared among.
    """

    name: str
    peak_bytes: int
    seconds: float
    ended: float
    threads: int
    overlap: int


def key_name(key: Any) -> str:
    """The name of a task's key: its layer for an array task (``("mean-chunk-ab12", 0, 3)``)."""
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class TaskPeaks(WorkerPlugin):
    """Worker plugin: the peak memory and duration of every task a worker runs.

    On a single-threaded worker each task's own peak (the high-water mark is reset when it
    starts). On a worker with several threads, the high-water mark is reset when a task starts
    on an idle worker, and each task's record holds the worker's growth since then: what all
    the tasks running together needed, which :func:`~.runs.report` compares with
    the plan's prediction for that many tasks.
    """

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        """Start with no records."""
        self.records: deque[TaskRecord] = deque(maxlen=KEPT_RECORDS)
        self.started: dict[Any, tuple[int, float]] = {}
        self.worker = worker
        self.threads = worker_threads(worker)
        self.period_base = 0
        self.period_stored = 0
        self.overlap = 1

    def _stored(self) -> int:
        """Bytes of task results the worker holds in memory now."""
        return worker_stored_bytes(self.worker)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Reset the high-water mark when a task starts (alone); read it when it ends."""
        if finish == "executing":
            if self.threads == 1 or not self.started:
                reset_high_water_mark()
                self.period_base = status_bytes("VmRSS")
                self.period_stored = self._stored() if self.threads > 1 else 0
                self.overlap = 1
            self.started[key] = (status_bytes("VmRSS"), time.perf_counter())
            self.overlap = max(self.overlap, len(self.started))
        elif start == "executing" and key in self.started:
            rss, began = self.started.pop(key)
            if self.threads == 1:
                peak = status_bytes("VmHWM") - rss
            else:  # results stored since the period began are not the running tasks' own
                stored = max(0, self._stored() - self.period_stored)
                peak = status_bytes("VmHWM") - self.period_base - stored
            self.records.append(
                TaskRecord(
                    key_name(key),
                    max(0, peak),
                    time.perf_counter() - began,
                    time.time(),
                    self.threads,
                    1 if self.threads == 1 else self.overlap,
                )
            )

    def since(self, moment: float) -> list[TaskRecord]:
        """The records of tasks that ended after ``moment`` (a ``time.time()``)."""
        return [r for r in self.records if r.ended >= moment]

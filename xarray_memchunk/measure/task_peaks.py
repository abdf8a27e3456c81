"""The worker plugin that measures the memory of every task (see :mod:`~.runs`).

Imported only where a ``distributed`` cluster is in use, so that importing the package does not
import ``distributed``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, NamedTuple

from distributed.diagnostics.plugin import WorkerPlugin

from .._dask_compat import worker_stored_bytes, worker_task_bytes, worker_threads
from ..models.profiling import reset_high_water_mark, status_bytes, trim_allocator

__all__ = ["KEPT_RECORDS", "PLUGIN_NAME", "TRIM_ABOVE", "TaskPeaks", "TaskRecord", "key_name"]

#: Name of the worker plugin that measures tasks.
PLUGIN_NAME = "memchunk-task-peaks"
#: Task records a worker keeps (the oldest are dropped).
KEPT_RECORDS = 100_000
#: What a measuring period may keep before the allocator's freed pages are handed back to
#: read it (:meth:`_Process.end_period`): most periods keep less, and pay nothing (a trim of a
#: fragmented 160 MB heap took 25 ms, then 7 ms each, holding the process's lock). Below it,
#: what glibc holds freed (8-15 MiB in a review's runs, 4 MiB or less trimmed) is read as
#: kept: the measure leaves out only what a first period kept beyond this
#: (:func:`~xarray_memchunk.measure.runs._warm`).
TRIM_ABOVE = 16 * 2**20


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
    period
        On a worker with several threads, which of its process's measuring periods the task
        ran in (they are counted from 1); 0 on a single-threaded worker.
    retained
        On a worker with several threads, what its process still held more when the period
        ended (its threads all idle) than when it began, less the results it stores more: what
        the period's tasks loaded and kept (imports, compiled code, opened files). None while
        the period runs, and on a single-threaded worker.
    result_bytes
        The size of the task's result, as Dask counts it (a gather's: the whole it made).
    """

    name: str
    peak_bytes: int
    seconds: float
    ended: float
    threads: int
    overlap: int
    period: int = 0
    retained: int | None = None
    result_bytes: int = 0


def key_name(key: Any) -> str:
    """The name of a task's key: its layer for an array task (``("mean-chunk-ab12", 0, 3)``)."""
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class _Process:
    """What the workers of this process share: its memory, so one measuring period.

    A process-based cluster runs one worker per process. A cluster of threads
    (``LocalCluster(processes=False)``) runs all its workers in one: a high-water mark reset by
    one worker's task is the others' too, and their tasks grow the same resident memory, so
    their tasks are measured together, as one worker's with all their threads.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[int, Any] = {}
        self.started: dict[tuple[int, Any], tuple[int, float]] = {}
        self.period_base = 0
        self.period_stored = 0
        self.overlap = 1
        self.period = 0
        self.retained: dict[int, int] = {}

    def threads(self) -> int:
        """Threads of all this process's workers."""
        return sum(worker_threads(w) for w in self.workers.values()) or 1

    def stored(self) -> int:
        """Bytes of task results all this process's workers hold in memory now."""
        return sum(worker_stored_bytes(w) for w in self.workers.values())

    def end_period(self) -> None:
        """Keep what the period that ends now retained (its threads are all idle).

        Where that is over :data:`TRIM_ABOVE`, freed pages the allocator keeps are handed back
        first: they are not what the tasks kept (a worker without a nanny keeps more).
        """
        stored = max(0, self.stored() - self.period_stored)
        retained = status_bytes("VmRSS") - self.period_base - stored
        if retained > TRIM_ABOVE:
            trim_allocator()
            retained = status_bytes("VmRSS") - self.period_base - stored
        self.retained[self.period] = max(0, retained)
        while len(self.retained) > KEPT_RECORDS:  # the oldest first
            del self.retained[next(iter(self.retained))]


_PROCESS = _Process()


class TaskPeaks(WorkerPlugin):
    """Worker plugin: the peak memory and duration of every task a worker runs.

    On a single-threaded worker each task's own peak (the high-water mark is reset when it
    starts). On a worker with several threads, the high-water mark is reset when a task starts
    on an idle worker, and each task's record holds the worker's growth since then: what all
    the tasks running together needed, which :func:`~.runs.report` compares with
    the plan's prediction for that many tasks. Workers that share a process (a cluster of
    threads) count as one worker with all their threads (:class:`_Process`).
    """

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        """Start with no records."""
        self.records: deque[TaskRecord] = deque(maxlen=KEPT_RECORDS)
        self.worker = worker
        with _PROCESS.lock:
            _PROCESS.workers[id(worker)] = worker

    def teardown(self, worker: Any) -> None:
        """Forget ``worker``: its tasks no longer share the process's measuring period."""
        with _PROCESS.lock:
            _PROCESS.workers.pop(id(worker), None)
            for key in [k for k in _PROCESS.started if k[0] == id(worker)]:
                del _PROCESS.started[key]

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Reset the high-water mark when a task starts (alone); read it when it ends."""
        process, task = _PROCESS, (id(self.worker), key)
        with process.lock:
            threads = process.threads()
            if finish == "executing":
                for gone in [k for k in process.started if k[0] not in process.workers]:
                    del process.started[gone]  # a worker closed as its task started
                if threads == 1 or not process.started:
                    reset_high_water_mark()
                    process.period_base = status_bytes("VmRSS")
                    process.period_stored = process.stored() if threads > 1 else 0
                    process.overlap = 1
                    process.period += threads > 1
                process.started[task] = (status_bytes("VmRSS"), time.perf_counter())
                process.overlap = max(process.overlap, len(process.started))
            elif start == "executing" and task in process.started:
                rss, began = process.started.pop(task)
                if threads == 1:
                    peak = status_bytes("VmHWM") - rss
                else:  # results stored since the period began are not the running tasks' own
                    stored = max(0, process.stored() - process.period_stored)
                    peak = status_bytes("VmHWM") - process.period_base - stored
                self.records.append(
                    TaskRecord(
                        key_name(key),
                        max(0, peak),
                        time.perf_counter() - began,
                        time.time(),
                        threads,
                        1 if threads == 1 else process.overlap,
                        0 if threads == 1 else process.period,
                        None,
                        worker_task_bytes(self.worker, key),
                    )
                )
                if threads > 1 and not process.started:
                    process.end_period()

    def since(self, moment: float) -> list[TaskRecord]:
        """The records of tasks that ended after ``moment`` (a ``time.time()``).

        Each with what its period retained (:attr:`TaskRecord.retained`), where it has ended.
        """
        with _PROCESS.lock:
            retained = dict(_PROCESS.retained)
        return [
            r._replace(retained=retained.get(r.period)) if r.period else r
            for r in self.records
            if r.ended >= moment
        ]

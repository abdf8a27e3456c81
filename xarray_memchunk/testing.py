"""Watch a ``distributed`` cluster while a computation runs: worker memory, pauses, restarts.

Worker memory is sampled from the client's side (``psutil`` on the worker processes of a
``LocalCluster``, which are this process's descendants), so the samples of a worker that is
killed are kept, and a restarted worker shows up as a new process. Workers that run in this
process (``processes=False``) measure this process's memory, and so does the watch. Pauses and
removals of workers are read from the scheduler's event log, and a worker already paused when
the watch starts counts as a pause.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._dask_compat import is_pause_event, worker_removal, workers_in_this_process

__all__ = ["ClusterWatch", "RunOutcome", "run_watched", "watch"]


@dataclass
class RunOutcome:
    """What happened when one computation ran on the cluster.

    Attributes
    ----------
    label
        Name of the case.
    completed
        Whether the computation returned a result.
    error
        The exception's type and first line, when it did not.
    seconds
        Wall time from submission to result (or failure).
    peak_worker_bytes
        Largest sampled RSS of each worker process (a restarted worker is another process);
        this process's, keyed by its pid, where workers run in it.
    pauses
        Times a worker was paused for memory (status changed to ``paused``), a worker paused
        when the watch started included.
    worker_deaths
        Workers removed from the cluster while it ran, killed or crashed: not those retired
        (an adaptive cluster scaling down removes a worker expectedly).
    n_tasks
        Tasks in the graph.
    series
        ``{pid: [(seconds since start, rss bytes), ...]}`` for plotting.
    extra
        Anything else the caller records (chunks, predicted peak, ...).
    """

    label: str
    completed: bool
    error: str
    seconds: float
    peak_worker_bytes: dict[int, int]
    pauses: int
    worker_deaths: int
    n_tasks: int
    series: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """Largest sampled RSS of any worker process."""
        return max(self.peak_worker_bytes.values(), default=0)


#: Seconds :class:`ClusterWatch` waits for workers started apart to give their pids.
WORKER_ASK_TIMEOUT = 2.0


class ClusterWatch:
    """Sample the RSS of every worker process of a ``LocalCluster`` every ``interval`` seconds.

    Use as a context manager around a computation; ``series`` and ``peaks`` hold the samples.
    ``on_refresh`` is called every 0.25 s from the sampling thread (to poll events).
    """

    def __init__(
        self,
        interval: float = 0.02,
        on_refresh: Callable[[], None] | None = None,
        client: Any = None,
    ) -> None:
        import psutil

        self.interval = interval
        self.on_refresh = on_refresh
        self.client = client
        self._apart: dict[int, Any] = {}  # worker processes started apart, last found
        self.series: dict[int, list[tuple[float, int]]] = {}
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = 0.0

    def _worker_processes(self) -> dict[int, Any]:
        """The processes workers run in, by pid.

        ``multiprocessing``'s spawned children (a ``LocalCluster``'s workers), and this process
        while it holds a worker (``processes=False``). Where there are none and a client is
        given, the processes of its workers that run on this machine (``dask worker``
        processes started apart), as the workers give their pids.
        """
        import psutil

        found = {os.getpid(): self._process} if _workers_in_this_process() else {}
        for proc in self._process.children(recursive=True):
            try:
                if "spawn_main" in " ".join(proc.cmdline()):
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        if not found and self.client is not None:
            apart = _local_worker_processes(self.client)
            found = self._apart if apart is None else apart  # unanswered: the last ones
            self._apart = found
        return found

    def _run(self) -> None:
        import psutil

        processes: dict[int, Any] = {}
        last_refresh = -1.0
        while not self._stop.is_set():
            now = time.perf_counter() - self.start
            if now - last_refresh > 0.25:  # a new pid is a restarted worker
                processes = self._worker_processes()
                if self.on_refresh is not None:
                    self.on_refresh()
                last_refresh = now
            for pid, proc in list(processes.items()):
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    processes.pop(pid, None)
                    continue
                self.series.setdefault(pid, []).append((now, rss))
            time.sleep(self.interval)

    def __enter__(self) -> ClusterWatch:
        self.start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peaks(self) -> dict[int, int]:
        """Largest RSS sample per worker process."""
        return {pid: max(v for _, v in samples) for pid, samples in self.series.items() if samples}


def _local_worker_processes(client: Any) -> dict[int, Any] | None:
    """The processes of ``client``'s workers that run on this machine, by pid.

    None where the workers could not be asked (an asynchronous client, the scheduler gone);
    each is asked within :data:`WORKER_ASK_TIMEOUT`, and one that does not answer is left out.
    """
    import socket

    import psutil

    from .clusters import ask_workers

    try:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
    except Exception:  # the scheduler gone: ask again later
        return None
    where = ask_workers(
        client, lambda: (socket.gethostname(), os.getpid()), workers, WORKER_ASK_TIMEOUT
    )
    if where is None:
        return None
    found = {}
    for host, pid in where.values():
        if host != socket.gethostname():
            continue
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid)
    return found


def _workers_in_this_process() -> bool:
    """Whether a ``distributed.Worker`` that has not closed runs in this process."""
    return "distributed" in sys.modules and bool(workers_in_this_process())


class _EventLog:
    """Collect the scheduler's pause and worker-removal events while a computation runs.

    The scheduler forgets the event topic of a worker shortly after removing it, so the log is
    polled during the run, not only read at the end.
    """

    def __init__(self, client, since: float) -> None:
        self.client = client
        self.since = since
        self.pauses: set[tuple[str, float]] = set()
        self.deaths: set[tuple[str, float]] = set()

    def paused_now(self) -> None:
        """Count the workers paused already: their pause was logged before ``since``."""
        if self.client is None:
            return
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        for address, worker in workers.items():
            if worker.get("status") == "paused":
                self.pauses.add((address, self.since))

    def poll(self) -> None:
        if self.client is None:  # processes without a scheduler: nothing to read
            return
        try:
            events = self.client.get_events()
        except Exception:  # scheduler busy: the next poll catches up
            return
        for topic, entries in events.items():
            for stamp, msg in entries:
                if stamp < self.since:
                    continue
                if is_pause_event(msg):
                    self.pauses.add((topic, stamp))
                removal = worker_removal(topic, msg)
                if removal is not None and not removal.expected:  # not a retirement
                    self.deaths.add((removal.worker, stamp))


def run_watched(
    client,
    label: str,
    build: Callable[[], Any],
    *,
    interval: float = 0.02,
    timeout: float | None = None,
) -> RunOutcome:
    """Build a lazy result with ``build()``, compute it on ``client``'s cluster and watch.

    Any exception from building (a planning error) or computing (``KilledWorker``) is recorded
    in the outcome, not raised. With ``timeout`` (seconds), a computation not done by then is
    cancelled and recorded as a ``TimeoutError``: workers paused over memory that never frees
    may otherwise wait forever.
    """
    import dask

    n_tasks = 0

    def work() -> None:
        nonlocal n_tasks
        result = build()
        n_tasks = len(result.__dask_graph__())
        if timeout is None:
            dask.compute(result)
            return
        future = client.compute(result)
        try:
            future.result(timeout=timeout)
        except TimeoutError:
            client.cancel(future)
            raise TimeoutError(f"not done after {timeout:g} s: stopped") from None

    outcome = watch(client, label, work, interval=interval)
    outcome.n_tasks = n_tasks
    return outcome


def watch(client, label: str, work: Callable[[], Any], *, interval: float = 0.02) -> RunOutcome:
    """Run ``work()`` (which computes on ``client``'s cluster) and watch the workers.

    ``client`` may be None for work that runs in spawned processes of its own (Cubed's
    ``processes`` executor): their memory is sampled alike, and no pauses or deaths are read.
    Any exception from ``work`` is recorded in the outcome, not raised.
    """
    events = _EventLog(client, time.time())
    events.paused_now()
    with ClusterWatch(interval, on_refresh=events.poll, client=client) as watcher:
        start = time.perf_counter()
        try:
            work()
            completed, error = True, ""
        except Exception as exc:  # the outcome records the failure
            completed = False
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        seconds = time.perf_counter() - start
    time.sleep(0.3)  # let the scheduler log the last status changes
    events.poll()
    return RunOutcome(
        label=label,
        completed=completed,
        error=error,
        seconds=seconds,
        peak_worker_bytes=watcher.peaks,
        pauses=len(events.pauses),
        worker_deaths=len(events.deaths),
        n_tasks=0,
        series=watcher.series,
    )

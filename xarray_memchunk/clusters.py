"""Which Dask cluster is active, and what its scheduler says of its workers."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._dask_compat import (
    adaptive_bounds,
    bounded_run,
    bounded_run_on_scheduler,
    worker_device_memory_limit,
    worker_memory_limit,
    worker_threads,
    workers_in_this_process,
)
from .errors import MemchunkError
from .planning.budget import CLIENT_SOURCE

__all__ = [
    "ASK_TIMEOUT",
    "DEFAULT_SATURATION",
    "DISTRIBUTED_MEMORY_DEFAULTS",
    "WORKER_SATURATION_KEY",
    "ClusterFacts",
    "DeviceFacts",
    "WorkerLayout",
    "active_client",
    "ask_workers",
    "cluster_facts",
    "device_facts",
    "memory_threshold",
    "no_workers_error",
    "spec_workers",
    "task_overhead_seconds",
    "this_process_memory",
    "workers_on_this_machine",
]

_logger = logging.getLogger(__name__)


#: Seconds a plan waits for the workers (their memory now) or the scheduler (its queueing) to
#: answer before it plans with what it knows: a stopped or wedged worker accepts the
#: connection and never answers (:func:`~._dask_compat.bounded_run`). Answers take 5-10 ms on
#: a LocalCluster.
ASK_TIMEOUT = 5.0
#: The dask config key of the scheduler's queue depth: root tasks sent per worker thread.
WORKER_SATURATION_KEY = "distributed.scheduler.worker-saturation"
#: distributed's default ``worker-saturation``, where neither a scheduler nor the config says.
DEFAULT_SATURATION = 1.1

#: ``distributed.worker.memory`` thresholds (fractions of a worker's memory limit) where
#: distributed's own configuration is not loaded (it is not imported).
DISTRIBUTED_MEMORY_DEFAULTS = {"target": 0.6, "spill": 0.7, "pause": 0.8, "terminate": 0.95}


def memory_threshold(*names: str, otherwise: float) -> float:
    """The first enabled of ``distributed.worker.memory.<name>``, or ``otherwise``.

    A threshold set to ``False`` (or ``None``) is disabled, and the next name is tried: e.g.
    ``memory_threshold("pause", "terminate", otherwise=0.95)`` is where a worker stops taking
    tasks, or is killed when it never pauses.
    """
    import dask

    for name in names:
        value = dask.config.get(
            f"distributed.worker.memory.{name}", DISTRIBUTED_MEMORY_DEFAULTS[name]
        )
        if value:
            return float(value)
    return otherwise


def task_overhead_seconds() -> float:
    """Cost of one task to its thread, beyond its work, in seconds.

    The dask config key ``memchunk.task-overhead``, else the measured default of the scheduler
    that will run it: a distributed client's, or the threaded scheduler's.
    """
    import dask

    from .planning.problem import DISTRIBUTED_TASK_OVERHEAD_S, TASK_OVERHEAD_S

    configured = dask.config.get("memchunk.task-overhead", None)
    if configured is not None:
        return float(configured)
    return DISTRIBUTED_TASK_OVERHEAD_S if active_client() is not None else TASK_OVERHEAD_S


def active_client():
    """Return the active ``distributed.Client``, or None (never imports distributed itself)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


class WorkerLayout(NamedTuple):
    """One worker's memory limit (bytes, None without one) and threads."""

    memory_limit: int | None
    nthreads: int


@dataclass(frozen=True)
class ClusterFacts:
    """What the scheduler, or the cluster's worker spec, says of its workers.

    Attributes
    ----------
    memory_limit
        The smallest worker memory limit, bytes; None where no worker has one.
    threads_per_worker
        The most threads one worker has.
    n_workers
        Workers running, or, before any runs, the workers the cluster's spec starts.
    address
        The scheduler's address.
    largest_process_memory
        The largest worker process memory (asked again where the scheduler's last heartbeat
        said more than the configured baseline); before any worker runs, this process's
        memory where the workers will run in it, else 0.
    workers
        Every worker's :class:`WorkerLayout`, from which the budget takes the tightest; empty
        where not known.
    source
        Where these facts came from, as :attr:`~xarray_memchunk.Budget.source` states it.
    in_this_process
        Whether workers run in this Python process (``processes=False``): such a worker's
        memory is everything this process holds, the caller's data included, and they are
        one entry of ``workers``, of all their threads.
    """

    memory_limit: int | None
    threads_per_worker: int
    n_workers: int
    address: str
    largest_process_memory: int
    workers: tuple[WorkerLayout, ...] = ()
    source: str = ""
    in_this_process: bool = False

    @property
    def total_threads(self) -> int:
        """Threads of all workers: the tasks that run at once."""
        return sum(w.nthreads for w in self.workers)


def no_workers_error(address: str) -> MemchunkError:
    """The error for a cluster that has no workers and none on the way."""
    return MemchunkError(
        f"the Dask cluster at {address} has no workers: nothing could run a plan. Start "
        f"workers (cluster.scale(n) or cluster.adapt(maximum=n)), or close the client to plan "
        f"for this machine"
    )


def cluster_facts(client, ask_above: int | None = None) -> ClusterFacts:
    """The workers of ``client``'s cluster: running ones, else those its worker spec starts.

    Running workers are read from the scheduler. Before any runs (an adaptive cluster scaled
    to zero, a job queue still waiting), a ``SpecCluster`` (``LocalCluster``,
    dask-jobqueue's clusters) says what it starts: see :func:`spec_workers`. Where a worker's
    last heartbeat reported more memory than ``ask_above`` bytes, the workers are asked what
    they hold now (:func:`_memory_now`); None: the heartbeats' figures.

    Raises
    ------
    MemchunkError
        When the cluster has no workers and no worker spec to start them: a plan made then
        would wait for ever.
    """
    info = client.scheduler_info(n_workers=-1)
    address = info.get("address", "?")
    workers = info.get("workers", {})
    if workers:
        here = {w.address for w in workers_in_this_process() if w.address}
        layouts = [
            (WorkerLayout(w.get("memory_limit") or None, int(w.get("nthreads", 1))), a in here)
            for a, w in workers.items()
        ]
        reported = {a: int(w.get("metrics", {}).get("memory") or 0) for a, w in workers.items()}
        if ask_above is not None and max(reported.values()) > ask_above:
            reported = _memory_now(client, reported)
        rss = max(reported.values())
        return _facts(layouts, address, rss, f"{CLIENT_SOURCE} {address}")
    planned = _planned_workers(getattr(client, "cluster", None))
    if planned is None:
        raise no_workers_error(address)
    layouts, how = planned
    return _facts(layouts, address, 0, f"{CLIENT_SOURCE} {address}: {how}")


def _memory_now(client: Any, reported: dict[str, int]) -> dict[str, int]:
    """Each worker's process memory now, asked with ``client.run``; else as ``reported``.

    A heartbeat's figure may be a second old: just after a computation, the memory its tasks
    held (361 MiB reported by a worker that held 137 MiB again, after the median of
    ``benchmarks/floors.py``), which a plan would take for its baseline. Every worker is asked
    (one broadcast), as distributed measures it (resident memory); one that does not answer
    keeps its heartbeat's figure, as does every worker of an asynchronous client or of a
    client that cannot run functions on its workers, and all of them where not every worker
    answered within :data:`ASK_TIMEOUT`.
    """
    now = ask_workers(client, this_process_memory, list(reported))
    if now is None:
        return reported
    return reported | {a: int(v) for a, v in now.items() if isinstance(v, int | float)}


def ask_workers(
    client: Any, function: Callable[[], Any], workers: list[str], timeout: float = ASK_TIMEOUT
) -> dict[str, Any] | None:
    """What each of ``workers`` answers running ``function``, within ``timeout`` seconds.

    :func:`~._dask_compat.bounded_run`: a worker whose call failed is left out. None where
    they could not be asked: an asynchronous client (``run`` would return a coroutine), a
    client that cannot run functions on its workers, or not every worker answering in time.
    """
    if getattr(client, "asynchronous", False):
        return None
    try:
        return bounded_run(client, function, workers, timeout)
    except Exception:  # no answer in time, a scheduler gone, a client that cannot run them
        return None


def _facts(
    layouts: list[tuple[WorkerLayout, bool]], address: str, rss: int, source: str
) -> ClusterFacts:
    """:class:`ClusterFacts` of these workers: the smallest limit, the most threads.

    Parameters
    ----------
    layouts
        Each worker's layout, and whether it runs in this process.
    address
        The scheduler's address.
    rss
        The largest worker process memory now (0 before any worker runs).
    source
        Where the workers were found, as :attr:`~xarray_memchunk.Budget.source` states it.

    Returns
    -------
    ClusterFacts
        Workers that run in this process each pause on the memory of the whole process, where
        all of them run tasks, and that memory is this process's now: they are one worker of
        all their threads, at the smallest of their limits, whose memory is at least this
        process's.
    """
    here = [layout for layout, runs_here in layouts if runs_here]
    workers = [layout for layout, runs_here in layouts if not runs_here]
    if here:
        rss = max(rss, this_process_memory())
        limits = [w.memory_limit for w in here if w.memory_limit]
        threads = sum(w.nthreads for w in here)
        workers.append(WorkerLayout(min(limits) if limits else None, threads))
        source += (
            "; its worker runs in this process"
            if len(here) == 1
            else f"; its {len(here)} workers run in this process, each pausing on all it "
            f"holds: planned as one of their {threads} threads"
        )
    limits = [w.memory_limit for w in workers if w.memory_limit]
    return ClusterFacts(
        memory_limit=min(limits) if limits else None,
        threads_per_worker=max(w.nthreads for w in workers),
        n_workers=len(workers),
        address=address,
        largest_process_memory=rss,
        workers=tuple(workers),
        source=source,
        in_this_process=bool(here),
    )


def scheduler_queueing(client: Any) -> tuple[float, int] | None:
    """The scheduler's ``worker-saturation`` (root tasks sent per thread) and its threads.

    None where it cannot be asked: an asynchronous client, or a scheduler that does not
    answer (within :data:`ASK_TIMEOUT`). The function run there is sent by value
    (cloudpickle), so a scheduler without this package answers too.
    """
    if client is None or getattr(client, "asynchronous", False):
        return None

    def ask(dask_scheduler: Any) -> tuple[float, int]:
        return float(dask_scheduler.WORKER_SATURATION), int(dask_scheduler.total_nthreads)

    try:
        return bounded_run_on_scheduler(client, ask, ASK_TIMEOUT)
    except Exception:  # an older or foreign scheduler: nothing to say
        return None


def this_process_memory() -> int:
    """Resident memory of this process, bytes, as a worker running in it measures its own."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def spec_workers(cluster) -> tuple[list[WorkerLayout], str] | None:
    """The workers a ``SpecCluster`` starts, and how they were found; None where none.

    Parameters
    ----------
    cluster
        ``client.cluster``: a ``SpecCluster`` (``LocalCluster``, dask-jobqueue's clusters),
        or None for a client connected to a scheduler's address.

    Returns
    -------
    tuple of (list of WorkerLayout, str) or None
        The workers of ``cluster.worker_spec`` (asked for, not yet running), and, for an
        adaptive cluster, as many more of ``cluster.new_spec`` as its adaptive maximum allows
        (its minimum, or one, where it has no maximum). None where ``cluster`` starts no
        worker.
    """
    planned = _planned_workers(cluster)
    if planned is None:
        return None
    layouts, how = planned
    return [layout for layout, _ in layouts], how


def _planned_workers(cluster) -> tuple[list[tuple[WorkerLayout, bool]], str] | None:
    """:func:`spec_workers`, each worker with whether it will run in this process."""
    specs = getattr(cluster, "worker_spec", None)
    if specs is None:
        return None
    layouts = [
        (layout, _spec_runs_here(spec)) for spec in specs.values() for layout in _spec_layouts(spec)
    ]
    adaptive = adaptive_bounds(cluster)
    new_spec = getattr(cluster, "new_spec", None)
    if adaptive is not None and new_spec:
        minimum, maximum = adaptive
        finite = math.isfinite(maximum)
        target = int(maximum) if finite else max(1, int(minimum))
        layout = (_spec_layouts(new_spec)[0], _spec_runs_here(new_spec))
        layouts += [layout] * max(0, target - len(layouts))
        bound = "its adaptive maximum" if finite else "no adaptive maximum: its minimum, or 1"
        how = f"the adaptive cluster's worker spec, no worker running yet ({bound})"
    else:
        how = "the cluster's worker spec, no worker running yet"
    if not layouts:
        return None
    return layouts, f"{how}: {len(layouts)} worker(s)"


def _spec_runs_here(spec: dict) -> bool:
    """Whether a worker spec entry starts a ``distributed.Worker`` in this process.

    ``LocalCluster(processes=False)`` names ``Worker`` as its ``cls``; ``processes=True`` names
    ``Nanny``, which starts the worker in a process of its own, and dask-jobqueue a job class,
    which starts it on another host. A class given by name is imported as ``SpecCluster``
    imports it.
    """
    from distributed import Worker
    from distributed.utils import import_term

    cls = spec.get("cls")
    if isinstance(cls, str):
        try:
            cls = import_term(cls)
        except (ImportError, AttributeError, ValueError):
            return False
    return isinstance(cls, type) and issubclass(cls, Worker)


def _spec_layouts(spec: dict) -> list[WorkerLayout]:
    """The workers one worker spec entry starts: one, or one per process of a job.

    ``LocalCluster``'s entries hold a worker's ``memory_limit`` and ``nthreads``;
    dask-jobqueue's hold a job's ``memory`` and ``cores``, shared by its ``processes`` (its
    ``group`` names them).
    """
    options = spec.get("options", {})
    processes = len(spec.get("group", ())) or int(options.get("processes") or 1)
    threads = _spec_threads(options, processes)
    return [WorkerLayout(_spec_memory(options, threads, processes), threads)] * processes


def _spec_threads(options: dict, processes: int) -> int:
    """Threads of one worker of a spec: its own, its job's cores shared, or dask's default."""
    from dask.system import CPU_COUNT

    for name in ("nthreads", "threads_per_worker", "ncores", "threads"):
        if options.get(name):
            return int(options[name])
    if options.get("cores"):
        return max(1, int(options["cores"]) // processes)
    return CPU_COUNT


def _spec_memory(options: dict, threads: int, processes: int) -> int | None:
    """Memory limit of one worker of a spec, read as the worker will read it (None: no limit)."""
    from dask.utils import parse_bytes

    if "memory_limit" not in options and options.get("memory"):
        return parse_bytes(options["memory"]) // processes  # a job's memory, on another host
    return worker_memory_limit(options.get("memory_limit", "auto"), threads, logger=_logger)


@dataclass(frozen=True)
class DeviceFacts:
    """What a cluster's workers say of their GPUs: enough to budget a plan for CuPy data.

    Attributes
    ----------
    total
        Memory of the smallest GPU a worker uses.
    in_use
        The most already allocated on one of those GPUs (every CUDA context on it, CuPy
        pools, other processes), as its workers read it.
    threads_per_gpu
        The most worker threads sharing one GPU: the tasks that can run on it at once.
    n_gpus
        GPUs the workers use.
    device_memory_limit
        The smallest dask-cuda ``device_memory_limit`` (task outputs are kept on the device up
        to it before they spill to the host), or None for workers without one.
    address
        The scheduler's address.
    """

    total: int
    in_use: int
    threads_per_gpu: int
    n_gpus: int
    device_memory_limit: int | None
    address: str


def pool_cached_bytes() -> int:
    """Device bytes that CuPy's default memory pool keeps cached in this process.

    The driver counts them as allocated, but this process's next CuPy allocations reuse them:
    for the tasks this process runs they are free memory.
    """
    import cupy

    return int(cupy.get_default_memory_pool().free_bytes())


def _worker_device(dask_worker) -> dict:
    """The GPU of ``dask_worker``: bus id, free and total memory, threads, dask-cuda's limit."""
    import cupy

    device = cupy.cuda.Device()
    free, total = device.mem_info  # creates this worker's CUDA context first, if needed
    free += pool_cached_bytes()
    return {
        "gpu": device.pci_bus_id,
        "free": int(free),
        "total": int(total),
        "threads": worker_threads(dask_worker),
        "device_memory_limit": worker_device_memory_limit(dask_worker),
    }


def device_facts(client) -> DeviceFacts:
    """Ask every worker of ``client``'s cluster for its GPU's memory (:class:`DeviceFacts`).

    Raises
    ------
    MemchunkError
        When the cluster has no workers, or its workers cannot use CuPy or a GPU.
    """
    info = client.scheduler_info(n_workers=-1)
    if not info.get("workers"):  # a GPU is read by a running worker, never from a spec
        raise no_workers_error(info.get("address", "?"))
    try:
        reports = list(client.run(_worker_device).values())
    except Exception as exc:
        raise MemchunkError(
            f"the Dask cluster's workers cannot read a GPU ({type(exc).__name__}: {exc}): "
            f"plan CuPy data on a cluster whose workers have CuPy and a GPU (e.g. "
            f"dask_cuda.LocalCUDACluster), or pass memory_limit= as the device memory"
        ) from exc
    by_gpu: dict[str, list[dict]] = {}
    for report in reports:
        by_gpu.setdefault(report["gpu"], []).append(report)
    limits = [r["device_memory_limit"] for r in reports if r["device_memory_limit"]]
    return DeviceFacts(
        total=min(r["total"] for r in reports),
        in_use=max(g[0]["total"] - min(r["free"] for r in g) for g in by_gpu.values()),
        threads_per_gpu=max(sum(r["threads"] for r in g) for g in by_gpu.values()),
        n_gpus=len(by_gpu),
        device_memory_limit=min(limits) if limits else None,
        address=info.get("address", "?"),
    )


def _this_machine(host: str) -> bool:
    """Whether ``host`` (a worker's IP address or name) is this machine."""
    import ipaddress
    import socket

    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:  # a name, not an address
        pass
    if host == "localhost":
        return True
    try:
        name = socket.gethostname()
        own = {name, socket.getfqdn(), *socket.gethostbyname_ex(name)[2]}
    except OSError:
        return False
    return host in own


def workers_on_this_machine(client: Any) -> bool:
    """Whether the client's workers all run on this machine (and see its directories).

    A ``LocalCluster``'s do; so do ``dask worker`` processes started here, found by their
    addresses in the scheduler's worker list. A cluster without workers yet is not known to be.
    """
    if client is None:
        return True
    from urllib.parse import urlsplit

    from distributed import LocalCluster

    if isinstance(getattr(client, "cluster", None), LocalCluster):
        return True
    try:
        addresses = list(client.scheduler_info().get("workers", {}))
    except Exception:  # a scheduler that cannot say: assume other machines
        return False
    hosts = [urlsplit(a).hostname or "" for a in addresses]
    return bool(hosts) and all(_this_machine(h) for h in hosts)

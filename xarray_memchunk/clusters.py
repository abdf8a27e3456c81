"""Which Dask cluster is active, and what its scheduler says of its workers."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .errors import MemchunkError

__all__ = [
    "DISTRIBUTED_MEMORY_DEFAULTS",
    "ClusterFacts",
    "DeviceFacts",
    "active_client",
    "cluster_facts",
    "device_facts",
    "memory_threshold",
    "task_overhead_seconds",
]


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


@dataclass(frozen=True)
class ClusterFacts:
    """What the scheduler says of its workers: enough to budget a plan."""

    memory_limit: int | None
    threads_per_worker: int
    n_workers: int
    address: str
    largest_process_memory: int


def cluster_facts(client) -> ClusterFacts:
    """Smallest worker's memory limit and threads, worker count, and the largest worker RSS.

    Raises
    ------
    MemchunkError
        When the cluster has no workers: a plan made then would wait for ever.
    """
    info = client.scheduler_info(n_workers=-1)
    workers = list(info.get("workers", {}).values())
    address = info.get("address", "?")
    if not workers:
        raise MemchunkError(
            f"the Dask cluster at {address} has no workers: nothing could run a plan. Start "
            f"workers (cluster.scale(n)), or close the client to plan for this machine"
        )
    limited = [w for w in workers if w.get("memory_limit")]
    smallest = min(limited, key=lambda w: w["memory_limit"]) if limited else workers[0]
    threads = int(smallest.get("nthreads", 1))
    total_threads = sum(int(w.get("nthreads", 1)) for w in workers)
    rss = max(int(w.get("metrics", {}).get("memory") or 0) for w in workers)
    return ClusterFacts(
        memory_limit=smallest.get("memory_limit") or None,
        threads_per_worker=threads,
        n_workers=max(1, total_threads // max(1, threads)),
        address=address,
        largest_process_memory=rss,
    )


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
    limit = getattr(dask_worker.data, "device_memory_limit", None)
    return {
        "gpu": device.pci_bus_id,
        "free": int(free),
        "total": int(total),
        "threads": int(dask_worker.state.nthreads),
        "device_memory_limit": int(limit) if limit else None,
    }


def device_facts(client) -> DeviceFacts:
    """Ask every worker of ``client``'s cluster for its GPU's memory (:class:`DeviceFacts`).

    Raises
    ------
    MemchunkError
        When the cluster has no workers, or its workers cannot use CuPy or a GPU.
    """
    cluster_facts(client)  # no workers: the same clear error
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
        address=client.scheduler_info().get("address", "?"),
    )

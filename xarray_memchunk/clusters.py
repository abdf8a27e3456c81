"""Which Dask cluster is active, and what its scheduler says of its workers."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .errors import MemchunkError

__all__ = [
    "DISTRIBUTED_MEMORY_DEFAULTS",
    "ClusterFacts",
    "active_client",
    "cluster_facts",
    "memory_threshold",
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

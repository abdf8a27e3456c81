"""How many bytes one task may use, and where that number came from.

The per-task budget is::

    per_task = (pause_fraction * worker_memory - worker_baseline) * task_share / threads_per_worker

- ``worker_memory``: the memory limit of one worker (the smallest one on a cluster).
- ``pause_fraction``: Dask pauses a worker whose process memory passes this fraction of its limit
  (config ``distributed.worker.memory.pause``, 0.8 by default) and kills it at 0.95; the plan stays
  below the pause threshold, so a run that follows it is never paused nor killed.
- ``worker_baseline``: what an idle worker process already holds (interpreter, numpy, scipy,
  distributed itself); config ``memchunk.worker-baseline``, 200 MB by default (an idle
  ``LocalCluster`` worker measured 150-180 MB RSS here).
- ``task_share``: the part of the rest one running task may take; the remainder is for what else a
  worker holds at the same time (inputs fetched for the next task, results not yet sent to their
  consumer, allocator fragmentation). Config ``memchunk.task-share``, 0.75 by default.
- ``threads_per_worker``: every thread of a worker runs a task at once.

Sources, in order: an explicit ``budget=`` argument (bytes, or a size string parsed like
``LocalCluster(memory_limit=...)``), the active ``distributed.Client``'s workers, the dask config
key ``memchunk.worker-memory``, and the memory available on this machine for the threaded
scheduler.

CuPy-backed data is budgeted against the GPU's memory instead (:func:`device_budget`): the
same formula with the device's total memory, what is already in use on it as the baseline,
and ``memchunk.device-memory-fraction`` (0.8) in place of the pause threshold, since nothing
pauses a GPU task: CUDA raises an out-of-memory error. An explicit argument or the config key
``memchunk.device-memory`` takes precedence.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import dask

from .units import format_bytes, to_bytes

__all__ = ["Budget", "device_budget", "per_task_bytes", "resolve_budget"]

DEFAULT_WORKER_BASELINE = "200MB"
DEFAULT_TASK_SHARE = 0.75
DEFAULT_PAUSE_FRACTION = 0.8
DEFAULT_DEVICE_FRACTION = 0.8

#: How :meth:`Budget.explain` names pause_fraction, worker_memory and worker_baseline.
_TERM_NAMES = {
    "cpu": ("pause threshold", "worker memory", "idle worker"),
    "gpu": ("usable fraction", "device memory", "in use"),
}


@dataclass(frozen=True)
class Budget:
    """The memory one task may use.

    Attributes
    ----------
    worker_memory
        Memory limit of one worker, bytes.
    threads_per_worker
        Tasks a worker runs at once.
    n_workers
        Number of workers; ``n_workers * threads_per_worker`` tasks run at once.
    per_task
        Bytes one task may use at its peak (see the module docstring for the formula).
    source
        Where ``worker_memory`` came from, e.g. ``"argument"`` or
        ``"distributed client tcp://127.0.0.1:8786"``.
    worker_baseline, task_share, pause_fraction
        The terms of the formula, kept so that :meth:`explain` can show the arithmetic.
    device
        ``"cpu"``, or ``"gpu"`` for a GPU's memory (the terms are named accordingly in
        :meth:`explain`).
    """

    worker_memory: int
    threads_per_worker: int
    n_workers: int
    per_task: int
    source: str
    worker_baseline: int = 0
    task_share: float = 1.0
    pause_fraction: float = 1.0
    device: str = "cpu"

    @property
    def total_threads(self) -> int:
        """Tasks that run at the same time across all workers."""
        return self.n_workers * self.threads_per_worker

    def explain(self) -> str:
        """State the per-task budget and the arithmetic behind it."""
        fraction, memory, baseline = _TERM_NAMES[self.device]
        return (
            f"per-task budget {format_bytes(self.per_task)} = "
            f"({self.pause_fraction:g} {fraction} x {format_bytes(self.worker_memory)} {memory} "
            f"- {format_bytes(self.worker_baseline)} {baseline}) x {self.task_share:g} "
            f"task share / {self.threads_per_worker} thread(s) per worker; "
            f"source: {self.source}; {self.n_workers} worker(s) x {self.threads_per_worker} "
            f"thread(s)"
        )


def per_task_bytes(
    worker_memory: int,
    threads_per_worker: int,
    *,
    worker_baseline: int,
    task_share: float,
    pause_fraction: float,
) -> int:
    """Apply the per-task budget formula of this module to plain numbers.

    Returns
    -------
    int
        Bytes one task may use; at least 1 so that an impossible budget is reported by the
        planner with the minimum the operator needs, not here.
    """
    usable = pause_fraction * worker_memory - worker_baseline
    return max(1, int(usable * task_share / max(1, threads_per_worker)))


def _formula_terms() -> dict[str, float | int]:
    pause = dask.config.get("distributed.worker.memory.pause", DEFAULT_PAUSE_FRACTION)
    if not pause:  # pausing disabled: the terminate threshold is the only wall left
        pause = dask.config.get("distributed.worker.memory.terminate", 0.95) or 0.95
    baseline = to_bytes(
        dask.config.get("memchunk.worker-baseline", DEFAULT_WORKER_BASELINE),
        what="memchunk.worker-baseline",
    )
    share = float(dask.config.get("memchunk.task-share", DEFAULT_TASK_SHARE))
    return {"pause_fraction": float(pause), "worker_baseline": baseline, "task_share": share}


def make_budget(
    worker_memory: int,
    threads_per_worker: int,
    n_workers: int,
    source: str,
    device: str = "cpu",
    **terms: float | int,
) -> Budget:
    """Build a :class:`Budget` from a worker's memory and threads with the configured terms.

    ``terms`` (``pause_fraction``, ``worker_baseline``, ``task_share``) replace configured ones.
    """
    terms = _formula_terms() | terms
    return Budget(
        worker_memory=worker_memory,
        threads_per_worker=threads_per_worker,
        n_workers=n_workers,
        per_task=per_task_bytes(worker_memory, threads_per_worker, **terms),
        source=source,
        device=device,
        **terms,
    )


def active_client():
    """Return the active ``distributed.Client``, or None (never imports distributed itself)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _client_workers(client) -> tuple[int | None, int, int, str]:
    """Smallest worker memory limit, its threads, worker count and scheduler address."""
    info = (
        client.scheduler_info(n_workers=-1)
        if _accepts_n_workers(client)
        else (client.scheduler_info())
    )
    workers = list(info.get("workers", {}).values())
    if not workers:
        return None, 1, 0, info.get("address", "?")
    limited = [w for w in workers if w.get("memory_limit")]
    smallest = min(limited, key=lambda w: w["memory_limit"]) if limited else workers[0]
    memory = smallest.get("memory_limit") or None
    total_threads = sum(int(w.get("nthreads", 1)) for w in workers)
    threads = int(smallest.get("nthreads", 1))
    n_workers = max(1, total_threads // max(1, threads))
    return memory, threads, n_workers, info.get("address", "?")


def _accepts_n_workers(client) -> bool:
    import inspect

    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def resolve_budget(budget: Budget | int | float | str | None = None, device: str = "cpu") -> Budget:
    """Find the memory one task may use.

    Parameters
    ----------
    budget
        ``None`` to discover it (active ``distributed.Client``, then the dask config key
        ``memchunk.worker-memory``, then this machine's available memory); the memory limit of
        one worker as bytes or a size string (``"1.5GB"``), meaning what
        ``LocalCluster(memory_limit=...)`` means; or a ready :class:`Budget`, used as is.
    device
        ``"gpu"`` for CuPy-backed data: discovered budgets come from ``memchunk.device-memory``
        or the GPU (:func:`device_budget`), and a given size means the device memory.

    Returns
    -------
    Budget

    Raises
    ------
    BudgetError
        When ``budget`` cannot be parsed, or is zero or negative.
    """
    if isinstance(budget, Budget):
        return budget
    client = active_client()
    cluster = _client_workers(client) if client is not None else None
    if budget is not None:
        worker_memory = to_bytes(budget)
        if cluster is not None and cluster[2]:
            _, threads, n_workers, _ = cluster
        else:
            threads, n_workers = 1, os.cpu_count() or 1
        return make_budget(worker_memory, threads, n_workers, "argument")
    if device == "gpu":
        return device_budget(cluster[1] if cluster is not None and cluster[2] else None)
    if cluster is not None and cluster[0]:
        memory, threads, n_workers, address = cluster
        return make_budget(memory, threads, n_workers, f"distributed client {address}")
    configured = dask.config.get("memchunk.worker-memory", None)
    if configured is not None:
        threads = int(dask.config.get("memchunk.threads-per-worker", 1))
        n_workers = max(1, (os.cpu_count() or 1) // threads)
        return make_budget(
            to_bytes(configured, what="memchunk.worker-memory"),
            threads,
            n_workers,
            "dask config memchunk.worker-memory",
        )
    return system_budget()


def system_budget() -> Budget:
    """Budget for Dask's threaded scheduler: this machine's available memory, one thread per CPU."""
    import psutil

    threads = os.cpu_count() or 1
    available = int(psutil.virtual_memory().available)
    return make_budget(available, threads, 1, "system memory (available, threaded scheduler)")


def device_budget(threads: int | None = None) -> Budget:
    """Budget for CuPy-backed data: the memory of the current GPU.

    Parameters
    ----------
    threads
        Tasks that run on the GPU at once: a distributed worker's threads (one worker per GPU,
        as ``dask_cuda.LocalCUDACluster`` starts them), else one per CPU (the threaded
        scheduler).

    Returns
    -------
    Budget
        From the config key ``memchunk.device-memory`` when set, else from
        ``cupy.cuda.Device().mem_info``: the total as the memory, what is already allocated
        (CUDA context, CuPy's memory pool, other processes) as the baseline.
    """
    fraction = float(dask.config.get("memchunk.device-memory-fraction", DEFAULT_DEVICE_FRACTION))
    configured = dask.config.get("memchunk.device-memory", None)
    if configured is not None:
        total = to_bytes(configured, what="memchunk.device-memory")
        in_use, source = 0, "dask config memchunk.device-memory"
    else:
        import cupy

        device = cupy.cuda.Device()
        free, total = device.mem_info
        in_use, source = total - free, f"GPU {device.id} (cupy): {format_bytes(free)} free"
    return make_budget(
        int(total),
        threads or os.cpu_count() or 1,
        1,
        source,
        device="gpu",
        pause_fraction=fraction,
        worker_baseline=int(in_use),
    )

"""The per-thread memory budget as plain arithmetic: what one task slot of a worker may hold.

The budget is::

    per_task = (pause_fraction * worker_memory - worker_baseline)
               * (1 - reserve) / threads_per_worker

- ``worker_memory``: the memory limit of one worker (on a cluster of unlike workers, the one
  whose task slots get the least: :func:`tightest_worker`).
- ``pause_fraction``: Dask pauses a worker whose process memory passes this fraction of its
  limit (``distributed.worker.memory.pause``, 0.8 by default) and kills it at 0.95; plans stay
  below the pause threshold, so a run that follows one is never paused nor killed.
- ``worker_baseline``: what the worker process holds before the computation (interpreter,
  libraries, data it already stores).
- ``reserve``: a fraction kept free for what no model sees: allocator fragmentation, the
  spread of measured peaks, the worker's own bookkeeping.
- ``threads_per_worker``: every thread of a worker runs a task at once.

What else a worker holds while a task runs (inputs produced ahead of their task, a rechunk's
pieces, a stencil's neighbour chunks) depends on the chunks, so it is not a share of this
budget: each plan counts it (:mod:`~xarray_memchunk.planning.footprint`) and checks the task
plus those chunks against ``per_task``.

Discovering ``worker_memory`` and the baseline (a Dask cluster, the dask config, this machine,
a GPU) is :mod:`xarray_memchunk.memory_limits`'s job; nothing here looks outside its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BudgetError
from ..units import format_bytes

__all__ = [
    "MEASURED_BASELINE",
    "Budget",
    "format_size_up",
    "held_memory_remedy",
    "min_worker_memory",
    "per_task_bytes",
    "tightest_worker",
]

#: ``Budget.baseline_source`` when the baseline is what the workers' processes hold now
#: (more than the configured one: memory left from earlier work).
MEASURED_BASELINE = "the largest worker's process memory now"

#: How :meth:`Budget.explain` names pause_fraction, worker_memory and worker_baseline.
_TERM_NAMES = {
    "cpu": ("pause threshold", "memory_limit", "worker baseline"),
    "gpu": ("usable fraction", "device memory", "in use"),
}


@dataclass(frozen=True)
class Budget:
    """The memory one task slot (a worker thread) may use, and where that number came from.

    Attributes
    ----------
    worker_memory
        Memory limit of one worker, bytes.
    threads_per_worker
        Tasks a worker runs at once.
    n_workers
        Number of workers; ``n_workers * threads_per_worker`` tasks run at once.
    per_task
        Bytes one task slot may use: the task, its assembled input and the chunks held for it
        (see the module docstring for the formula).
    source
        Where ``worker_memory`` came from, e.g. ``"argument"`` or
        ``"distributed client tcp://127.0.0.1:8786"``.
    worker_baseline, reserve, pause_fraction
        The terms of the formula, kept so that :meth:`explain` can show the arithmetic.
    device
        ``"cpu"``, or ``"gpu"`` for a GPU's memory (the terms are named accordingly).
    baseline_source
        Where ``worker_baseline`` came from (a default, or measured on the cluster).
    decimal
        Show sizes in decimal units (MB, GB) in :meth:`explain`, as the user wrote them.
    """

    worker_memory: int
    threads_per_worker: int
    n_workers: int
    per_task: int
    source: str
    worker_baseline: int = 0
    reserve: float = 0.0
    pause_fraction: float = 1.0
    device: str = "cpu"
    baseline_source: str = ""
    decimal: bool = False

    @property
    def total_threads(self) -> int:
        """Tasks that run at the same time across all workers."""
        return self.n_workers * self.threads_per_worker

    def format(self, nbytes: float) -> str:
        """Format ``nbytes`` in the units the user gave the memory in (decimal or binary)."""
        return format_size(nbytes, decimal=self.decimal)

    def format_minimum(self, nbytes: float) -> str:
        """As :meth:`format`, rounded up: a minimum stated is one that suffices."""
        return format_size_up(nbytes, decimal=self.decimal)

    def explain(self) -> str:
        """State the per-task budget and the arithmetic behind it."""
        fraction, memory, baseline = _TERM_NAMES[self.device]
        measured = f" ({self.baseline_source})" if self.baseline_source else ""
        return (
            f"per-task budget {self.format(self.per_task)} = "
            f"({self.pause_fraction:g} {fraction} x {self.format(self.worker_memory)} {memory} "
            f"- {self.format(self.worker_baseline)} {baseline}{measured}) "
            f"x (1 - {self.reserve:g} reserve) / {self.threads_per_worker} thread(s) per worker; "
            f"source: {self.source}; {self.n_workers} worker(s) x {self.threads_per_worker} "
            f"thread(s)"
        )


def format_size(nbytes: float, *, decimal: bool = False) -> str:
    """``1.50 GB`` (decimal) or ``1.40 GiB`` (binary, as Dask prints sizes)."""
    if not decimal:
        return format_bytes(int(nbytes))
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= 0.9 * scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def format_size_up(nbytes: float, *, decimal: bool = False) -> str:
    """As :func:`format_size`, rounded up to the hundredth of the unit shown.

    ``1.40 GiB`` is printed for 1.399 GiB and for 1.401 GiB alike; a stated minimum must not be
    the smaller one: 1.401 GiB is said ``1.41 GiB``.
    """
    units = (
        (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
        if decimal
        else (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("kiB", 2**10))
    )
    for unit, scale in units:
        if abs(nbytes) >= 0.9 * scale:
            return f"{math.ceil(nbytes / scale * 100 - 1e-9) / 100:.2f} {unit}"
    return f"{math.ceil(nbytes)} B"


def per_task_bytes(
    worker_memory: int,
    threads_per_worker: int,
    *,
    worker_baseline: int,
    reserve: float,
    pause_fraction: float,
    decimal: bool = False,
) -> int:
    """Apply the per-task budget formula of this module to plain numbers.

    Raises
    ------
    BudgetError
        When nothing is left for a task: the baseline is at or above the pause threshold.
        The message states the smallest worker memory that leaves room for one.
    """
    usable = pause_fraction * worker_memory - worker_baseline
    per_task = int(usable * (1.0 - reserve) / max(1, threads_per_worker))
    if per_task <= 0:
        size = lambda n: format_size(n, decimal=decimal)  # noqa: E731
        raise BudgetError(
            f"a worker with {size(worker_memory)} of memory has no room for a task: Dask pauses "
            f"it at {pause_fraction:g} x its memory ({size(pause_fraction * worker_memory)}), "
            f"and the worker already holds {size(worker_baseline)}. Give each worker more than "
            f"{size(worker_baseline / pause_fraction)} (memory_limit); twice that leaves a task "
            f"about {size(worker_baseline * (1 - reserve) / max(1, threads_per_worker))} per thread"
        )
    return per_task


def tightest_worker(
    workers: Sequence[tuple[int, int]], *, worker_baseline: int, pause_fraction: float
) -> tuple[int, int]:
    """The ``(memory limit, threads)`` of the worker whose task slots get the least memory.

    On a cluster of unlike workers, a task may run on any of them: the formula of this
    module applied to each, the smallest per-task budget is the one every task fits. It is
    not always the smallest memory limit's worker: 2 GB with 4 threads leaves a task less
    than 1 GB with 1.
    """
    return min(workers, key=lambda w: (pause_fraction * w[0] - worker_baseline) / max(1, w[1]))


def held_memory_remedy(worker_baseline: int, baseline_source: str, decimal: bool = False) -> str:
    """The remedy for a baseline left by earlier work on the workers, or ``""``.

    Parameters
    ----------
    worker_baseline
        Bytes a worker process holds before the computation.
    baseline_source
        Where ``worker_baseline`` came from: :data:`MEASURED_BASELINE` names memory the
        workers hold now, which a restart frees; a configured baseline has no such remedy.
    decimal
        Show the size in decimal units (MB), as the user wrote the memory limit.
    """
    if baseline_source != MEASURED_BASELINE:
        return ""
    return (
        f"or free the {format_size(worker_baseline, decimal=decimal)} a worker process holds "
        f"now from earlier work: client.restart() starts fresh workers (it drops the data they "
        f"hold)"
    )


def min_worker_memory(
    per_task: float,
    threads_per_worker: int,
    *,
    worker_baseline: int,
    reserve: float,
    pause_fraction: float,
) -> int:
    """Worker memory limit at which ``per_task`` bytes fit (the inverse of the formula)."""
    usable = per_task * threads_per_worker / (1.0 - reserve) + worker_baseline
    return math.ceil(usable / pause_fraction)

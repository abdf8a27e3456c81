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
A :class:`Budget` built by hand may state any ``per_task``: :meth:`Budget.explain` shows the
formula only where ``per_task`` is what it gives, and says ``as given`` otherwise.

Sizes are written in binary units, as Dask prints them (:mod:`xarray_memchunk.units`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import BudgetError
from ..units import format_decimal, format_in_unit_of, format_size, format_size_up

__all__ = [
    "IN_PROCESS_BASELINE",
    "THREADED_BASELINE",
    "MEASURED_BASELINE",
    "MIN_TASK_BYTES",
    "Budget",
    "format_size",
    "format_size_up",
    "held_memory_remedy",
    "min_worker_memory",
    "per_task_bytes",
    "tightest_worker",
    "with_baseline",
]

#: ``Budget.baseline_source`` when the baseline is what the workers' processes hold now
#: (more than the configured one: memory left from earlier work).
MEASURED_BASELINE = "the largest worker's process memory now"

#: ``Budget.baseline_source`` when the workers run in this Python process
#: (``LocalCluster(processes=False)``): a worker's memory is all that this process holds.
IN_PROCESS_BASELINE = "this Python process's memory now: its workers run in it"

#: ``Budget.baseline_source`` with no cluster: Dask's threaded scheduler computes in this
#: Python process, beside all it holds (your arrays in memory included).
THREADED_BASELINE = "this Python process's memory now: it computes the tasks, with no cluster"
#: How a budget read from a distributed client's workers names its source.
CLIENT_SOURCE = "distributed client"

#: How :meth:`Budget.explain` names pause_fraction, worker_memory, worker_baseline and a worker.
_TERM_NAMES = {
    "cpu": ("pause threshold", "memory_limit", "worker baseline", "worker"),
    "gpu": ("usable fraction", "device memory", "in use", "GPU"),
}


def _count(n: int, what: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


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
        Whether ``worker_memory`` was written in decimal units (``"2GB"``): :meth:`explain`
        then states it so too (``memory_limit 2 GB = 1.86 GiB``); every size is shown in binary
        units, as Dask prints them (:mod:`xarray_memchunk.units`).
    cores
        CPU cores the workers' threads share, where known (workers on this machine); 0 where
        not known: each thread computes on a core of its own.
    in_this_process
        The workers run in this Python process (``processes=False``): planned as one worker of
        all their threads, each pausing on all the process holds.
    baseline_remedies
        How to free what the baseline counts beyond an idle worker, where there is a way: a
        refusal names them.
    filled_while_running
        Of ``worker_baseline``, what the workers fill only as the run's tasks read (the chunk
        caches of the netCDF files a graph reads): a worker's growth while they run includes
        it, and a run's report measures its tasks without it.
    threaded_scheduler
        Planned with no cluster, for Dask's threaded scheduler: one process (``n_workers``
        1) whose threads run tasks at once. Nothing pauses it; the same margin is kept, and a
        refusal's advice names the process and its threads (the dask config ``num_workers``).
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
    cores: int = 0
    in_this_process: bool = False
    baseline_remedies: tuple[str, ...] = ()
    filled_while_running: int = 0
    threaded_scheduler: bool = False

    @property
    def baseline_is_this_process(self) -> bool:
        """Whether the baseline is this process's memory now, read with no cluster.

        The tasks then run in this process, beside all it holds: what it loads or keeps is in
        the baseline (:data:`THREADED_BASELINE`).
        """
        return self.threaded_scheduler and self.baseline_source.startswith(THREADED_BASELINE)

    @property
    def read_from_cluster(self) -> bool:
        """Whether it was read from a distributed client's workers (their memory included)."""
        return self.source.startswith(CLIENT_SOURCE)

    @property
    def total_threads(self) -> int:
        """Tasks that run at the same time across all workers."""
        return self.n_workers * self.threads_per_worker

    @property
    def compute_slots(self) -> int:
        """Tasks whose computations overlap in time: the time model's parallelism.

        Every thread of a CPU worker computes on its own core, up to the cores the threads
        share (:attr:`cores`, where known): 12 threads on 2 cores compute as 2 (a plan gains
        no time from more tasks than that, while each task re-reads the storage chunks it
        cuts). A GPU runs one task's kernels at a time (each fills the device), so its threads
        share one slot: a plan for a GPU gains nothing from more tasks than GPUs, while each
        task's halo, Dask overhead and launches cost time. Memory still counts every thread's
        task (:attr:`per_task`).
        """
        if self.device == "gpu":
            return self.n_workers
        return min(self.total_threads, self.cores) if self.cores else self.total_threads

    def format(self, nbytes: float) -> str:
        """Format ``nbytes`` as every size is shown: binary units, as Dask prints them."""
        return format_size(nbytes)

    def format_minimum(self, nbytes: float) -> str:
        """As :meth:`format`, rounded up: a minimum stated is one that suffices."""
        return format_size_up(nbytes)

    def memory_limit_advice(self, needed: int) -> str:
        """``give each worker at least <needed> (memory_limit) at <threads> ...``, for a refusal.

        Workers in this process are planned as one worker of all their threads, which pauses
        on all the process holds: the advice says so. With no cluster
        (:attr:`threaded_scheduler`), the process and its threads.
        """
        threads = self.threads_per_worker
        if self.threaded_scheduler:
            return (
                f"give this process at least {self.format_minimum(needed)} (memory_limit) for "
                f"the {_count(threads, 'task')} Dask's threaded scheduler runs at once in it"
            )
        per = (
            "in all in this process, whose workers pause on all it holds"
            if self.in_this_process
            else "per worker"
        )
        return (
            f"give each worker at least {self.format_minimum(needed)} (memory_limit) at "
            f"{threads} thread{'' if threads == 1 else 's'} {per}"
        )

    def gather_advice(
        self, result_bytes: int, variable: str = "", running: float = 0, pieces: int | None = None
    ) -> str:
        """What gathering a result of ``result_bytes`` into one worker costs, where it pauses it.

        Dask's last task of ``.compute()`` concatenates every chunk of the result on one
        worker: the pieces and the whole, about twice the result, beside the worker's
        baseline. Before it, the pieces finished so far wait beside the tasks still running
        (``running``: what a worker's task slots hold at their peak): a worker's share of the
        result, all of it with no cluster, where this process runs every task and keeps every
        piece (a user's stencil on a 30.52 MiB volume, computed with no cluster at its
        stated minimum, peaked at 0.77-0.84 of ``memory_limit``). ``pieces``: the bytes of
        every Dask-backed variable, whose pieces all wait so (``result_bytes`` where None). A
        Dataset is gathered a variable at a time (a ``finalize-`` task each): ``result_bytes``
        is then its largest Dask-backed variable's, named ``variable``. Where the larger of the
        two passes the pause threshold, the sentence that says so and what to do instead; an
        empty string where it fits, or where nothing is known of the workers.
        """
        if not result_bytes:
            return ""
        pieces = result_bytes if pieces is None else pieces
        share = pieces / (1 if self.threaded_scheduler else max(1, self.n_workers))
        gathering = 2 * result_bytes + self.worker_baseline
        while_running = share + running + self.worker_baseline
        pause = self.pause_fraction * self.worker_memory
        held = max(gathering, while_running)
        if self.device != "cpu" or not self.worker_memory or held <= pause:
            return ""
        into = "this process" if self.threaded_scheduler else "one worker"
        what = (
            f"each of its variables into {into} in turn, the largest ({variable!r}) "
            f"{self.format(result_bytes)}"
            if variable
            else f"its {self.format(result_bytes)} into {into}"
        )
        holder = "this process's" if self.threaded_scheduler else "the worker's"
        if gathering >= while_running:
            holds = (
                f"where Dask's last task holds the pieces and the whole (about "
                f"{self.format(2 * result_bytes)}) beside {holder} "
                f"{self.format(self.worker_baseline)} baseline"
            )
        else:
            holds = (
                f"where the pieces finished (up to {self.format(share)}) wait beside the "
                f"tasks still running ({self.format(running)}) and {holder} "
                f"{self.format(self.worker_baseline)} baseline"
            )
        over = (
            f"over the {self.format(pause)} that plans keep this process under "
            f"({self.pause_fraction:g} x its memory_limit), whatever the plan"
            if self.threaded_scheduler
            else f"over its {self.format(pause)} pause threshold as planned (the baseline is "
            f"the most a worker is expected to hold), that worker may pause or be killed "
            f"whatever the plan"
        )
        return (
            f"computing the result in one piece (.compute(), .values, .load()) gathers "
            f"{what}, {holds}: {over}; write it instead with "
            f"result.memchunk.to_zarr(path) (or to_netcdf), where each task writes its own "
            f"chunk and nothing is gathered, or reduce it first"
        )

    def minimum_memory_limit(self, per_task: float) -> int | None:
        """The worker ``memory_limit`` at which ``per_task`` bytes fit, at the same threads.

        None for a budget whose ``per_task`` was given by hand (:attr:`from_formula` False):
        no ``memory_limit`` decides it.
        """
        if not self.from_formula:
            return None
        return min_worker_memory(
            per_task,
            self.threads_per_worker,
            worker_baseline=self.worker_baseline,
            reserve=self.reserve,
            pause_fraction=self.pause_fraction,
        )

    @property
    def from_formula(self) -> bool:
        """Whether ``per_task`` is what the module's formula gives for the other terms.

        True of every budget :func:`~xarray_memchunk.memory_limits.make_budget` builds; a
        :class:`Budget` built by hand may state any ``per_task``.
        """
        try:
            formula = per_task_bytes(
                self.worker_memory,
                self.threads_per_worker,
                worker_baseline=self.worker_baseline,
                reserve=self.reserve,
                pause_fraction=self.pause_fraction,
            )
        except BudgetError:
            return False
        return formula == self.per_task

    def __str__(self) -> str:
        """:meth:`explain`: ``print(budget)`` shows the arithmetic, not the fields."""
        return self.explain()

    def explain(self) -> str:
        """State the per-task budget and the arithmetic behind it, in one unit.

        The formula's sizes are written in the unit of the result, so that the arithmetic
        printed gives the result printed (to the rounding of the last digit). A budget whose
        ``per_task`` does not follow from its terms (built by hand) is said to be given.
        """
        fraction, memory, baseline, worker = _TERM_NAMES[self.device]
        threads, per = self.threads_per_worker, self.per_task
        layout = f"{_count(self.n_workers, worker)} x {_count(threads, 'thread')}"
        if self.threaded_scheduler:  # no cluster: no worker either
            layout = f"this process x {_count(threads, 'thread')}"
            baseline = "process baseline"
        if self.cores and self.cores < self.total_threads:  # time counts these, not threads
            layout += f" on {_count(self.cores, 'core')}"
        if not self.from_formula:
            return (
                f"per-task budget {self.format(per)} as given (source: {self.source}), not "
                f"computed from the {memory} ({self.format(self.worker_memory)}); {layout}"
            )
        measured = f" ({self.baseline_source})" if self.baseline_source else ""
        written = (  # the limit as the user wrote it, beside the binary units it is shown in
            f"; {memory} {format_decimal(self.worker_memory)} = "
            f"{format_in_unit_of(self.worker_memory, per)}"
            if self.decimal
            else ""
        )
        return (
            f"per-task budget {format_in_unit_of(per, per)} = "
            f"({self.pause_fraction:g} {fraction} x {format_in_unit_of(self.worker_memory, per)} "
            f"{memory} - {format_in_unit_of(self.worker_baseline, per)} {baseline}{measured}) "
            f"x (1 - {self.reserve:g} reserve) / {_count(threads, 'thread')} per "
            f"{'process' if self.threaded_scheduler else worker}"
            f"{written}; source: {self.source}; {layout}"
        )


def with_baseline(
    budget: Budget, baseline: int, source: str, remedy: str = "", *, filled: bool = False
) -> Budget:
    """``budget`` for workers that hold ``baseline`` bytes between tasks, where that is more.

    A budget whose ``per_task`` was given by hand, or whose baseline is already as large, is
    returned as it is. ``source`` says where the larger baseline comes from; it is appended to
    a source already given (memory the workers hold now stays named, with its remedy).
    ``remedy``, where given, says how to free what the rise holds: a refusal names it.
    ``filled``: the workers fill the rise only as the run's tasks read
    (:attr:`Budget.filled_while_running`).

    Raises
    ------
    BudgetError
        When the larger baseline leaves no room for a task (:func:`per_task_bytes`).
    """
    if baseline <= budget.worker_baseline or not budget.from_formula:
        return budget
    per_task = per_task_bytes(
        budget.worker_memory,
        budget.threads_per_worker,
        worker_baseline=baseline,
        reserve=budget.reserve,
        pause_fraction=budget.pause_fraction,
        in_this_process=budget.in_this_process,
        threaded_scheduler=budget.threaded_scheduler,
        holder="this process" if budget.threaded_scheduler else "the worker",
        holds="would hold between tasks",
        baseline_note=f" (its baseline: {source})",
    )
    if budget.baseline_source:
        source = f"{budget.baseline_source}, and {source}"
    remedies = (*budget.baseline_remedies, remedy) if remedy else budget.baseline_remedies
    return replace(
        budget,
        per_task=per_task,
        worker_baseline=baseline,
        baseline_source=source,
        baseline_remedies=remedies,
        filled_while_running=budget.filled_while_running
        + (baseline - budget.worker_baseline if filled else 0),
    )


#: The smallest per-task budget a plan is made for where the workers run in this process: the
#: process also holds the client's graph and the scheduler's state, which grow when the plan is
#: submitted. Two in-process workers of 700 MB x 2 threads, in a process that held 553 MB, got
#: 1.4 MiB per task; once the plan was submitted the process held 569 MB, past the pause line
#: (0.8 x 700 MB), and the run hung with both workers paused.
MIN_TASK_BYTES = 16 * 2**20


def per_task_bytes(
    worker_memory: int,
    threads_per_worker: int,
    *,
    worker_baseline: int,
    reserve: float,
    pause_fraction: float,
    holder: str = "the worker",
    holds: str = "already holds",
    baseline_note: str = "",
    in_this_process: bool = False,
    threaded_scheduler: bool = False,
) -> int:
    """Apply the per-task budget formula of this module to plain numbers.

    ``holder`` names what holds the baseline, in the error: a worker, or the process its
    workers run in. Workers in this process (``in_this_process``) need at least
    :data:`MIN_TASK_BYTES` per task. ``holds`` says how it holds it: already, or (a baseline
    a plan raised) would; ``baseline_note`` follows its figure (where it comes from).
    ``threaded_scheduler``: the memory is a process's with no cluster
    (:attr:`Budget.threaded_scheduler`), which the message names.

    Raises
    ------
    BudgetError
        When nothing is left for a task (the baseline is at or above the pause threshold), or,
        for workers in this process, less than :data:`MIN_TASK_BYTES`. The message states the
        smallest worker memory that leaves room for one.
    """
    least = MIN_TASK_BYTES if in_this_process else 1
    threads = max(1, threads_per_worker)
    usable = pause_fraction * worker_memory - worker_baseline
    per_task = int(usable * (1.0 - reserve) / threads)
    if per_task < least:
        size = format_size
        least_memory = _least_worker_memory(
            least, threads, pause_fraction, worker_baseline, reserve
        )
        twice = (2 * least_memory * pause_fraction - worker_baseline) * (1 - reserve) / threads
        short = (
            f", which leaves {size(max(per_task, 0))} per task, under the {size(least)} a run "
            f"there needs beside its tasks"
            if least > 1
            else ""
        )
        pause = (
            f"a worker with {size(worker_memory)} of memory has no room for a task: Dask pauses "
            f"it at {pause_fraction:g} x its memory"
        )
        if threaded_scheduler:
            pause = (
                f"this process, planned with {size(worker_memory)} of memory and no cluster, has "
                f"no room for a task: its tasks are kept under {pause_fraction:g} x that memory, "
                f"as Dask pauses a worker"
            )
        reason = (
            f"{pause} ({size(pause_fraction * worker_memory)}), "
            f"and {holder} {holds} {size(worker_baseline)}{baseline_note}{short}"
            + (
                " (a number without a unit is bytes: write e.g. '1.5GB')"
                if worker_memory < UNIT_SLIP_BYTES
                else ""
            )
        )
        whom = "it" if threaded_scheduler else "each worker"
        raise BudgetError(
            f"{reason}. Give {whom} at least {format_size_up(least_memory)} "
            f"(memory_limit); twice that leaves a task about {size(twice)} per thread",
            minimum_memory_limit=least_memory,
            reason=reason,
        )
    return per_task


def _least_worker_memory(
    least: int, threads: int, pause_fraction: float, worker_baseline: int, reserve: float
) -> int:
    """The smallest worker memory (bytes) whose per-task budget is at least ``least``."""
    memory = math.ceil((worker_baseline + least * threads / (1.0 - reserve)) / pause_fraction)
    while int((pause_fraction * memory - worker_baseline) * (1.0 - reserve) / threads) < least:
        memory += 1  # the float's rounding: a few bytes at most
    return memory


#: Worker memory below which a budget's refusal says a bare number is bytes: ``memory_limit=1.5``
#: meant gigabytes (a new user's trial), and no worker runs in under a mebibyte.
UNIT_SLIP_BYTES = 2**20


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


def held_memory_remedy(worker_baseline: int, baseline_source: str) -> str:
    """The remedy for a baseline left by earlier work on the workers, or ``""``.

    Parameters
    ----------
    worker_baseline
        Bytes a worker process holds before the computation.
    baseline_source
        Where ``worker_baseline`` came from: :data:`MEASURED_BASELINE` alone names memory
        the workers hold now, which a restart frees (not where a figure of the operator's
        raised it: what its first run leaves, it leaves again); :data:`IN_PROCESS_BASELINE`,
        memory of this process, which its workers share; a configured baseline has no such
        remedy.
    """
    if baseline_source.startswith(IN_PROCESS_BASELINE):
        return (
            f"or free memory in this Python process: its workers run in it "
            f"(processes=False) and count all it holds, {format_size(worker_baseline)} now, "
            f"your own arrays included; or start them in processes of their own "
            f"(processes=True)"
        )
    if baseline_source.startswith(THREADED_BASELINE):
        return (
            f"or free memory in this Python process, which computes the tasks with no cluster "
            f"and holds {format_size(worker_baseline)} now, your own arrays included; or start "
            f"a distributed cluster, whose workers hold their tasks apart"
        )
    if baseline_source != MEASURED_BASELINE:  # none, configured, or raised past it:
        # a restart frees what earlier work left, not what running the operator leaves again
        # (a refusal planned again after planning's first runs grew the workers offered
        # "free the 283.96 MiB a worker process holds now" for flox's kernels)
        return ""
    return (
        f"or free the {format_size(worker_baseline)} a worker process holds "
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

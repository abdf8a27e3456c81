"""Where the per-task memory budget comes from: an argument, a Dask cluster, the config, a GPU.

The arithmetic (pause threshold, worker baseline, reserve, threads) is
:mod:`xarray_memchunk.planning.budget`; this module discovers its inputs:

- ``worker_memory``: in order, an explicit ``memory_limit`` argument (bytes, or a size string
  parsed like ``LocalCluster(memory_limit=...)``; capped, with a warning, at the active
  cluster's workers' own limits where those are smaller; with no cluster, the memory of this
  process, whose threads Dask's threaded scheduler runs tasks on), the active
  ``distributed.Client``'s tightest worker (the one whose task slots get the least memory;
  before any worker runs, the workers the cluster's worker spec starts), the dask config key
  ``memchunk.worker-memory``, and the memory available on this machine for the threaded
  scheduler.
- ``pause_fraction``: ``distributed.worker.memory.pause`` (0.8), or the terminate threshold where
  pausing is disabled.
- ``worker_baseline``: ``memchunk.worker-baseline`` (200 MB; an idle ``LocalCluster`` worker
  measured 130-180 MB RSS here), or more when the cluster's workers already hold more: the
  largest worker's process memory from the scheduler's last heartbeat. With no cluster and a
  given ``memory_limit``, this process's memory now, where that is more.
- ``reserve``: ``memchunk.reserve`` (0.1).

CuPy-backed data is budgeted against the GPU's memory instead (:func:`device_budget`): the
same formula with the device's total memory, what is already in use on it as the baseline,
and ``memchunk.device-memory-fraction`` (0.8) in place of the pause threshold, since nothing
pauses a GPU task: CUDA raises an out-of-memory error. An explicit argument or the config key
``memchunk.device-memory`` takes precedence.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import dask

from .clusters import (
    ClusterFacts,
    WorkerLayout,
    active_client,
    cluster_facts,
    device_facts,
    memory_threshold,
    pool_cached_bytes,
    this_process_memory,
    workers_on_this_machine,
)
from .errors import BudgetError, MemoryBudgetWarning
from .models.profiling import trim_allocator
from .planning.budget import (
    CLIENT_SOURCE,
    IN_PROCESS_BASELINE,
    MEASURED_BASELINE,
    THREADED_BASELINE,
    Budget,
    format_size,
    held_memory_remedy,
    per_task_bytes,
    tightest_worker,
)
from .units import to_bytes

__all__ = [
    "PLANNING_GROWTH_BYTES",
    "Budget",
    "budget_with_memory",
    "configured_baseline",
    "device_budget",
    "machine_cores",
    "make_budget",
    "resolve_budget",
    "system_budget",
]

DEFAULT_WORKER_BASELINE = "200MB"
DEFAULT_RESERVE = 0.1
DEFAULT_DEVICE_FRACTION = 0.8
#: One CUDA context, where no GPU can be read to measure what is allocated.
DEFAULT_DEVICE_BASELINE = "512MiB"


def is_decimal(value: int | float | str) -> bool:
    """Whether a size was written in decimal units (``"1.5GB"``, ``1.5e9``) rather than binary."""
    if isinstance(value, str):
        unit = value.strip().rstrip("bB").lower()
        return not unit.endswith("i") and any(c.isalpha() for c in value)
    return int(value) % 10**6 == 0 and int(value) % 2**20 != 0


def configured_baseline() -> int:
    """``memchunk.worker-baseline`` in bytes (:data:`DEFAULT_WORKER_BASELINE` where unset)."""
    return int(
        to_bytes(
            dask.config.get("memchunk.worker-baseline", DEFAULT_WORKER_BASELINE),
            what="memchunk.worker-baseline",
        )
    )


def _formula_terms() -> dict[str, float | int]:
    # pausing disabled: the terminate threshold is the only wall left
    pause = memory_threshold("pause", "terminate", otherwise=0.95)
    baseline = configured_baseline()
    reserve = float(dask.config.get("memchunk.reserve", DEFAULT_RESERVE))
    if not 0.0 <= reserve < 1.0:
        raise BudgetError(f"memchunk.reserve must be within [0, 1), got {reserve!r}")
    return {"pause_fraction": float(pause), "worker_baseline": baseline, "reserve": reserve}


def make_budget(
    worker_memory: int,
    threads_per_worker: int,
    n_workers: int,
    source: str,
    device: str = "cpu",
    *,
    decimal: bool | None = None,
    baseline_source: str = "",
    cores: int = 0,
    in_this_process: bool = False,
    threaded_scheduler: bool = False,
    **terms: float | int,
) -> Budget:
    """Build a :class:`Budget` from a worker's memory and threads with the configured terms.

    ``terms`` (``pause_fraction``, ``worker_baseline``, ``reserve``) replace configured ones;
    ``cores``: those the workers' threads share (:attr:`Budget.cores`; 0 where not known);
    ``in_this_process``, ``threaded_scheduler``: :attr:`Budget.in_this_process`,
    :attr:`Budget.threaded_scheduler`.
    """
    # the configured baseline, where the process holds less (or is not started): not measured
    configured = not baseline_source and "worker_baseline" not in terms
    terms = _formula_terms() | terms
    decimal = is_decimal(worker_memory) if decimal is None else decimal
    holder = _baseline_holder(baseline_source, threaded_scheduler)
    try:
        per_task = per_task_bytes(
            worker_memory,
            threads_per_worker,
            holder=holder,
            holds="is counted as holding"
            if holder == "an idle process" or configured
            else "already holds",
            baseline_note=" (memchunk.worker-baseline: what a process holds with the "
            "libraries loaded, counted until it holds more)"
            if configured
            else "",
            in_this_process=in_this_process,
            threaded_scheduler=threaded_scheduler,
            **terms,
        )
    except BudgetError as err:
        remedy = held_memory_remedy(int(terms["worker_baseline"]), baseline_source)
        raised = err
        if remedy:
            raised = BudgetError(
                f"{err}; {remedy}",
                minimum_memory_limit=err.minimum_memory_limit,
                reason=f"{err.reason}; {remedy}",
            )
        if err.minimum_memory_limit is not None:  # planning asks what the operator needs there
            raised.budget_at_minimum = make_budget(
                err.minimum_memory_limit,
                threads_per_worker,
                n_workers,
                source,
                device,
                decimal=decimal,
                baseline_source=baseline_source,
                cores=cores,
                in_this_process=in_this_process,
                threaded_scheduler=threaded_scheduler,
                **terms,
            )
        if raised is err:
            raise
        raise raised from None
    return Budget(
        worker_memory=int(worker_memory),
        threads_per_worker=threads_per_worker,
        n_workers=n_workers,
        per_task=per_task,
        source=source,
        device=device,
        decimal=decimal,
        baseline_source=baseline_source,
        cores=cores,
        in_this_process=in_this_process,
        threaded_scheduler=threaded_scheduler,
        **terms,
    )


def _baseline_holder(baseline_source: str, threaded_scheduler: bool) -> str:
    """What holds a budget's baseline, in a refusal: a worker, or a process.

    With no cluster (``threaded_scheduler``), this process where its memory is the baseline,
    else an idle one.
    """
    if threaded_scheduler:
        held = baseline_source.startswith(THREADED_BASELINE)
        return "this process" if held else "an idle process"
    if baseline_source.startswith(IN_PROCESS_BASELINE):
        return "this process, where its workers run,"
    return "the worker"


def budget_with_memory(budget: Budget, worker_memory: int) -> Budget:
    """``budget`` for workers of ``worker_memory`` bytes, every other term kept.

    Raises
    ------
    BudgetError
        When that memory leaves no room for a task (:func:`make_budget`).
    """
    return make_budget(
        worker_memory,
        budget.threads_per_worker,
        budget.n_workers,
        budget.source,
        budget.device,
        decimal=budget.decimal,
        baseline_source=budget.baseline_source,
        cores=budget.cores,
        in_this_process=budget.in_this_process,
        threaded_scheduler=budget.threaded_scheduler,
        pause_fraction=budget.pause_fraction,
        worker_baseline=budget.worker_baseline,
        reserve=budget.reserve,
    )


def _cluster_terms(facts: ClusterFacts) -> dict:
    """The configured baseline, or the largest worker's memory where it is already more.

    A worker that runs in this process (``processes=False``) holds all that this process
    holds: before it starts, that is this process's memory now. Such workers are marked
    (``in_this_process``), whichever baseline is the larger.
    """
    configured = _formula_terms()["worker_baseline"]
    here = {"in_this_process": True} if facts.in_this_process else {}
    if facts.largest_process_memory > configured:
        return here | {
            "worker_baseline": facts.largest_process_memory,
            "baseline_source": IN_PROCESS_BASELINE if facts.in_this_process else MEASURED_BASELINE,
        }
    return here


def _cluster_budget(facts: ClusterFacts, source: str) -> Budget:
    """The budget of the cluster's tightest worker with a memory limit.

    Every task fits the worker whose task slots get the least memory
    (:func:`~xarray_memchunk.planning.budget.tightest_worker`), and all the cluster's threads
    run tasks at once.
    """
    terms = _cluster_terms(facts)
    formula = _formula_terms() | terms
    memory, threads = tightest_worker(
        [w for w in facts.workers if w.memory_limit],
        worker_baseline=int(formula["worker_baseline"]),
        pause_fraction=float(formula["pause_fraction"]),
    )
    return make_budget(memory, threads, _n_workers(facts, threads), source, **terms)


def _n_workers(facts: ClusterFacts, threads: int) -> int:
    """Workers of ``threads`` threads that run as many tasks at once as the cluster."""
    return max(1, facts.total_threads // threads)


def _given_budget(memory_limit: int | float | str, facts: ClusterFacts | None) -> Budget:
    """The budget for a given worker memory limit, on the active cluster's workers if any.

    A worker given less memory than ``memory_limit`` pauses and dies at its own limit, so
    each worker plans with the smaller of the two, and a :class:`MemoryBudgetWarning` says
    so. A ``memory_limit`` at most the workers' is honoured, with their threads.
    """
    given = to_bytes(memory_limit, what="memory_limit")
    decimal = is_decimal(memory_limit)
    if facts is None:
        return _threaded_budget(given, decimal)
    smaller = [w.memory_limit for w in facts.workers if w.memory_limit and w.memory_limit < given]
    if not smaller:  # theirs, with what they hold now where it is more than the baseline
        threads = facts.threads_per_worker
        return make_budget(
            given,
            threads,
            _n_workers(facts, threads),
            "argument",
            decimal=decimal,
            **_cluster_terms(facts),
        )
    capped = [WorkerLayout(min(given, w.memory_limit or given), w.nthreads) for w in facts.workers]
    budget = _cluster_budget(
        replace(facts, workers=tuple(capped)),
        f"{facts.source} (its workers have less than memory_limit={memory_limit!r})",
    )
    warnings.warn(
        f"memory_limit={memory_limit!r} is more than the active Dask cluster's workers have: "
        f"{len(smaller)} of its {facts.n_workers} worker(s) have less, the smallest "
        f"{budget.format(min(smaller))} ({facts.address}). Planned with the workers' own "
        f"limits instead: "
        f"{budget.format(budget.worker_memory)} x {budget.threads_per_worker} thread(s), "
        f"{budget.format(budget.per_task)} per task. Leave memory_limit out to use the "
        f"cluster's, or give at most {budget.format(min(smaller))}",
        MemoryBudgetWarning,
        stacklevel=4,
    )
    return budget


def resolve_budget(
    memory_limit: Budget | int | float | str | None = None, device: str = "cpu"
) -> Budget:
    """Find the memory one task may use.

    Parameters
    ----------
    memory_limit
        ``None`` to discover it (active ``distributed.Client``, then the dask config key
        ``memchunk.worker-memory``, then this machine's available memory); the memory limit of
        one worker as bytes or a size string (``"1.5GB"``), meaning what
        ``LocalCluster(memory_limit=...)`` means; or a ready :class:`Budget`, used as is.
        With an active client, a worker whose own limit is smaller plans with its own (see
        Warns). With none, a given limit is that of this process, where Dask's threaded
        scheduler runs its threads' tasks at once (dask config ``num_workers``, else one per
        CPU).
    device
        ``"gpu"`` for CuPy-backed data: discovered budgets come from ``memchunk.device-memory``
        or the GPU (:func:`device_budget`), and a given size means the device memory.

    Returns
    -------
    Budget
        On a cluster of unlike workers, the tightest worker's: the one whose task slots get
        the least memory. Before any worker runs (an adaptive cluster at zero, jobs still
        queued), the workers the cluster's worker spec starts, as ``source`` says.

    Raises
    ------
    BudgetError
        When ``memory_limit`` cannot be parsed, is not a positive finite size, or leaves no
        room for a task.
    MemchunkError
        When the active client's cluster has no workers and no worker spec to start any.

    Warns
    -----
    MemoryBudgetWarning
        When ``memory_limit`` is more than the active cluster's workers have: the plan uses
        the workers' own limits, and the warning states both.
    """
    if isinstance(memory_limit, Budget):
        return memory_limit
    client = active_client()
    if device == "gpu":
        memory = None if memory_limit is None else to_bytes(memory_limit, what="memory_limit")
        return device_budget(memory, client)
    budget = _cpu_budget(memory_limit, client)
    return replace(budget, cores=machine_cores()) if workers_on_this_machine(client) else budget


def machine_cores() -> int:
    """CPU cores this machine gives its processes: Dask's count (affinity and cgroup quota)."""
    from dask.system import cpu_count

    return cpu_count()


def _cpu_budget(memory_limit: int | float | str | None, client: Any) -> Budget:
    """The CPU budget :func:`resolve_budget` finds, before the cores its workers share.

    The workers are asked what they hold now (:func:`~.clusters.cluster_facts`, one broadcast
    of a few milliseconds): a heartbeat's figure may be a second old, above what they hold
    after a computation, or below what a plan's first runs just left in them.
    """
    facts = cluster_facts(client, ask_above=0) if client is not None else None
    if memory_limit is not None:
        return _given_budget(memory_limit, facts)
    if facts is not None and facts.memory_limit:
        return _cluster_budget(facts, facts.source)
    if facts is not None:  # workers without a memory limit: the machine's memory, shared
        budget = system_budget()
        return make_budget(
            budget.worker_memory // facts.n_workers,
            facts.threads_per_worker,
            facts.n_workers,
            f"{facts.source} (workers without memory_limit: this machine's available memory, "
            f"shared)",
            decimal=False,
            **_cluster_terms(facts),
        )
    configured = dask.config.get("memchunk.worker-memory", None)
    if configured is not None:
        threads = int(dask.config.get("memchunk.threads-per-worker", 1))
        n_workers = max(1, machine_cores() // threads)
        return make_budget(
            to_bytes(configured, what="memchunk.worker-memory"),
            threads,
            n_workers,
            "dask config memchunk.worker-memory",
            decimal=is_decimal(configured),
        )
    return system_budget()


#: What this process may grow by while it plans (files opened and measured, a model
#: calibrated, modules imported): a no-cluster refusal's stated minimum allows for it, and a
#: refusal made while this process grew by more is planned once more from what it holds.
PLANNING_GROWTH_BYTES = 8 * 2**20


def held_by_this_process() -> int:
    """Bytes this process holds, as a no-cluster budget reads them: what it freed handed back.

    glibc keeps memory a computation freed; handed back first (``malloc_trim``), it is not
    read as held: after computing a GST3D result in this process and discarding it, 436 and
    479 MiB were read, 404 and 421 MiB once it was handed back.
    """
    trim_allocator()
    return this_process_memory()


def _threaded_budget(memory: int, decimal: bool) -> Budget:
    """A given ``memory_limit`` without a cluster: one process's, shared by Dask's threads.

    With no ``distributed`` client, ``.compute()`` runs the tasks on Dask's threaded scheduler,
    all its threads in this process at once: planned as one worker of those threads. Planned
    as workers of one thread each, a new user's function ran 2 tasks of 395.77 MiB in this
    process, which peaked at 1023 MiB against a ``memory_limit`` of 1 GB (953.67 MiB).
    Its baseline is what this process holds now (:func:`held_by_this_process`) where that is
    more than the configured one, as for workers in this process: a 549 MiB NumPy array,
    planned with the configured baseline at 1.5 GB, peaked at 1555-1583 MiB.
    """
    threads = threaded_scheduler_threads()
    held = held_by_this_process()
    terms: dict[str, Any] = {}
    if held > configured_baseline():  # what it holds, your arrays included, as processes=False
        terms = {"worker_baseline": held, "baseline_source": THREADED_BASELINE}
    source = (
        f"argument, for this process: with no Dask cluster, Dask's threaded scheduler runs "
        f"{threads} task(s) at once in it (start the cluster first to plan for its workers)"
    )
    return make_budget(
        memory, threads, 1, source, decimal=decimal, threaded_scheduler=True, **terms
    )


def threaded_scheduler_threads() -> int:
    """Tasks Dask's threaded scheduler runs at once: dask config ``num_workers``, else CPUs.

    The CPUs as Dask counts them (:data:`dask.system.CPU_COUNT`: affinity and cgroup quota),
    not the machine's: a container of 4 CPUs on a 64-core host runs 4 threads.

    Raises
    ------
    BudgetError
        When ``num_workers`` is set to anything but a whole number of at least 1.
    """
    from dask.system import CPU_COUNT

    value = dask.config.get("num_workers", None)
    if value is None:
        return CPU_COUNT
    try:
        threads = int(value)
    except (TypeError, ValueError):
        threads = 0
    if threads < 1 or (threads != value and str(threads) != str(value).strip()):
        raise BudgetError(
            f"the dask config key num_workers is {value!r}: Dask's threaded scheduler runs "
            f"that many tasks at once, so it must be a whole number of at least 1 (or unset: "
            f"one per CPU)"
        )
    return threads


def system_budget() -> Budget:
    """Budget for Dask's threaded scheduler: this machine's available memory, its threads."""
    import psutil

    threads = threaded_scheduler_threads()
    available = int(psutil.virtual_memory().available)
    return make_budget(
        available,
        threads,
        1,
        "system memory (available, threaded scheduler)",
        decimal=False,
        threaded_scheduler=True,
    )


def device_budget(device_memory: int | None = None, client=None) -> Budget:
    """Budget for CuPy-backed data: the memory of a GPU, shared by the tasks that run on it.

    Parameters
    ----------
    device_memory
        The device memory to plan for (an explicit ``memory_limit`` on CuPy data); else the
        config key ``memchunk.device-memory``, else the GPU's own total memory.
    client
        A ``distributed.Client`` whose workers run on GPUs: each worker reports its GPU
        (:func:`~xarray_memchunk.clusters.device_facts`); the tasks per GPU are the threads of
        the workers that share it. Without one, this process's current GPU, shared by the
        threaded scheduler's threads (dask config ``num_workers``, else one per CPU).

    Returns
    -------
    Budget
        Its baseline is what is already allocated on the device (every CUDA context and process
        on it), read from the GPU, less what the planning process's (or each worker's) CuPy
        memory pool keeps cached for reuse, plus, for dask-cuda workers, their
        ``device_memory_limit``: task outputs stay on the device up to it before they spill,
        and a task's own intermediates never spill. For a device memory given rather than read,
        the baseline is ``memchunk.device-baseline`` (512 MiB, one CUDA context) instead of
        what is allocated now.
    """
    fraction = float(dask.config.get("memchunk.device-memory-fraction", DEFAULT_DEVICE_FRACTION))
    configured = dask.config.get("memchunk.device-memory", None)
    local_threads = threaded_scheduler_threads()
    notes = ["allocated on the GPU now"]
    if device_memory is not None or configured is not None:  # a device described, not read
        given = device_memory is not None
        total = to_bytes(
            device_memory if given else configured,
            what="memory_limit" if given else "memchunk.device-memory",
        )
        source = "argument" if given else "dask config memchunk.device-memory"
        in_use = to_bytes(
            dask.config.get("memchunk.device-baseline", DEFAULT_DEVICE_BASELINE),
            what="memchunk.device-baseline",
        )
        notes = ["memchunk.device-baseline, one CUDA context"]
        threads, n_gpus = local_threads, 1
        if client is not None:  # one worker per GPU, as dask-cuda starts them
            facts = cluster_facts(client)
            threads, n_gpus = facts.threads_per_worker, facts.n_workers
    elif client is not None:
        facts = device_facts(client)
        total, in_use = facts.total, facts.in_use + (facts.device_memory_limit or 0)
        threads, n_gpus = facts.threads_per_gpu, facts.n_gpus
        source = f"{CLIENT_SOURCE} {facts.address}: {n_gpus} GPU(s), read by the workers"
        if facts.device_memory_limit:
            notes.append(f"dask-cuda device_memory_limit {format_size(facts.device_memory_limit)}")
    else:
        threads, n_gpus = local_threads, 1
        total, in_use, source = _local_device()
        if total is None:
            raise BudgetError(
                f"no GPU memory to plan CuPy data for ({source}). Pass memory_limit= (the "
                f"device memory), or set the dask config memchunk.device-memory"
            )
    return make_budget(
        int(total),
        threads,
        n_gpus,
        source,
        device="gpu",
        pause_fraction=fraction,
        worker_baseline=int(in_use),
        baseline_source=" + ".join(notes),
    )


def _local_device() -> tuple[int | None, int | None, str]:
    """Total and allocated memory of this process's current GPU, or Nones without one."""
    try:
        import cupy

        device = cupy.cuda.Device()
        free, total = device.mem_info
    except Exception as exc:  # no CuPy, no driver, no device: nothing to read
        return None, None, f"no GPU readable here: {type(exc).__name__}: {exc}"
    cached = pool_cached_bytes()
    source = f"GPU {device.id} (cupy): {format_size(free)} free"
    if cached:
        source += f" + {format_size(cached)} cached in CuPy's memory pool"
    return int(total), int(total - free - cached), source

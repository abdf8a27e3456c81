"""Measure the tasks of a planned run on a Dask cluster, report them, and learn from them.

``plan.apply()`` on a ``distributed`` cluster registers
:class:`~.task_peaks.TaskPeaks` on the workers (once) and keeps a :class:`Run` on the plan: the
cluster's client (weakly), when the graph was built, the layers of its input (the data as
rechunked for the plan) and those of its result. The workers then record every task's peak
(:class:`~.task_peaks.TaskRecord`). After the computation, :func:`report` (``plan.report()``)
gathers the run's tasks that ran since, and the scheduler's events (pauses, worker deaths and
why), and compares them with the plan's prediction.

- Tasks of the input's layers (a random generator, preprocessing, decoding a file, the
  rechunk) are not the operator's and are not counted, nor is the task that gathers a computed
  result into one array (``finalize-``) or closes a written store (``_finalize_store-``).
  Where Dask fuses producing a block into the operator's first task, it is part of that task,
  as it is in calibration; and a task that
  fuses the operator's last step with what follows (``apply(...).sum()``) is named after what
  follows and counted: it is what the worker ran. The tasks of another run that is still held
  (its plan or its result), input and result layers alike, are not counted, nor what ran
  after the gather or store that closed the run (:func:`_run_end`); another computation
  between ``apply`` and that compute would be. Nor are xarray's tasks on a Dataset's variables
  that the operator keeps unplanned (:attr:`Run.beside`), sized apart at plan time
  (:mod:`~xarray_memchunk.operators.kept_variables`).
- On a worker with several threads, tasks overlap: the worker's growth while its threads were
  busy is compared with the plan's prediction for that many tasks at once.
- A single-threaded worker's first operator task, where it ran no more, loads the operator's
  compiled code (Numba's runtime), which the plan counts apart (``plan.runtime_bytes``): that
  task's prediction includes it. And a worker's first tasks may take up to
  :data:`FIRST_TASK_BYTES` more (imports, setup), where their slot has that room, before they
  count as above their prediction. A worker that ran more is measured without its first
  tasks' setup: a single-threaded one without its first task, one with several threads less
  what the period of its first tasks retained. "First" is first in the run: a worker that ran
  the operator before (a second ``apply`` on the same cluster) has loaded it already, and an
  excess up to its runtime and setup goes unlearned there; the plan's slot counts the
  runtime, and a plan's baseline is what the workers hold.
- A worker death counts against the plan only where memory caused it (the nanny's
  ``worker-restart-memory`` event) and the worker was running one of the operator's tasks.

Learning: where an operator task was measured above its prediction (or memory killed a worker
running one), the observation is kept beside the operator's calibration
(:mod:`xarray_memchunk.models.learned`), which is never rewritten; the next plan raises the
model by the observed ratio, at most x2 per observation. A killed task left no record: its peak
is taken as at least what killed the worker (the terminate threshold, less the baseline), a
floor: the next plan of a self-calibrating operator measures it again first. Nothing is
learned from a run that held.

Measuring is on by default; the dask config key ``memchunk.measure-tasks`` (False) turns it
off. Its cost is two reads of ``/proc/self/status`` and one write to ``/proc/self/clear_refs``
per task (``benchmarks/task_measurement_overhead.py``).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from dask.utils import key_split

from .._dask_compat import (
    graph_layers,
    is_pause_event,
    memory_restart,
    worker_removal,
)
from ..clusters import active_client, memory_threshold
from ..errors import CalibrationError
from ..models.fitting import ABSOLUTE_SLACK
from ..models.learned import (
    Observation,
    forget_command,
    load_kept,
    record_kept,
    record_observation,
)
from ..planning.candidates import padded_extent
from ..planning.plan import ChunkPlan
from ..planning.search import operator_peak_within

if TYPE_CHECKING:  # the plugin's module imports distributed: only where a cluster is in use
    from .task_peaks import TaskRecord

__all__ = ["Run", "RunReport", "beside_layers", "input_layers", "record_run", "report"]

#: A measured task peak counts as above the prediction past this fraction (and
#: :data:`~xarray_memchunk.models.fitting.ABSOLUTE_SLACK` bytes: allocator noise).
TOLERANCE = 0.05
#: Dask's task that gathers a computed collection into one result (``finalize-...``) and
#: xarray's that closes a store it wrote (``_finalize_store-...``): the caller's, not the
#: operator's.
FINALIZE_PREFIXES = ("finalize-", "_finalize_store-")
#: Seconds after a run's end (:func:`_run_end`) whose pauses and deaths are still the run's: a
#: worker's memory monitor looks every 100 ms, and the scheduler stamps what it says later.
EVENTS_AFTER_END_S = 1.0
#: What a worker's first task may take once beyond its prediction before it counts as above
#: it: imports and setup a fresh worker does once (30 MB measured for a task of 0.8 MB; 4.3 MB
#: for a ``memchunk run mean`` task of a 7.7 kB netCDF variable, which learned a x2 model).
FIRST_TASK_BYTES = 32 * 2**20


def _worker_records(moment: float, dask_worker: Any = None) -> list[TaskRecord]:
    from .._dask_compat import worker_plugin
    from .task_peaks import PLUGIN_NAME

    plugin = worker_plugin(dask_worker, PLUGIN_NAME)
    return plugin.since(moment) if plugin is not None else []


def input_layers(source: Any) -> frozenset[str]:
    """Names of the graph layers that produce ``source``: tasks that are not the operator's.

    ``source`` is an xarray object (or a Dask collection); NumPy-backed data has none.
    """
    arrays = source.data_vars.values() if hasattr(source, "data_vars") else [source]
    names: set[str] = set()
    for array in arrays:
        names |= {str(k) for k in graph_layers(getattr(array, "data", array))}
    return frozenset(names)


@dataclass(eq=False)
class Run:
    """One ``apply`` of a plan on a ``distributed`` cluster: what :func:`report` needs.

    Kept on the plan (``plan.runs``, newest last); this module knows the runs held only weakly
    (to tell their tasks apart). A run holds its client weakly (a plan keeps no Client alive;
    a client gone cannot report anyway), and the names of layers only, not the data.

    Attributes
    ----------
    started
        When the graph was built (``time.time()``): tasks that ended before are not the run's.
    client
        A weak reference to the cluster's ``distributed.Client``.
    input_layers
        Layers of the input as rechunked for the plan: tasks that are not the operator's.
    layers
        The result's own layers (its graph's, less the input's): the operator's tasks.
    gather
        Where the result is too large to gather into one worker (``.compute()``), the
        sentence that says so (:meth:`~xarray_memchunk.planning.budget.Budget.gather_advice`);
        else empty.
    beside
        Names of the layers that only the result's kept variables have: a Dataset's variables
        the operator keeps without planning them, which xarray computes beside the plan (a
        static field a groupby broadcasts along its groups). Their tasks are not the
        operator's, nor are operator records their memory inflated (:meth:`is_beside`).
    beside_prefixes
        Of those, the names without their tokens that no layer of the planned variables'
        results has (``broadcast_to``): a task that Dask fused from one of them and later
        layers (the write of a store) is named after it, and the last layer's token.
    """

    started: float
    client: weakref.ref
    input_layers: frozenset[str]
    layers: frozenset[str]
    gather: str = ""
    beside: frozenset[str] = frozenset()
    beside_prefixes: frozenset[str] = frozenset()

    def is_beside(self, task: str) -> bool:
        """Whether the task named ``task`` computes a kept variable (:attr:`beside`)."""
        return _token(task) in self._beside_tokens or _named_after(task, self.beside_prefixes)

    @functools.cached_property
    def _beside_tokens(self) -> frozenset[str]:  # asked of every task record
        return frozenset(_token(n) for n in self.beside)


#: The runs held somewhere (on a plan or for a result), weakly: their layers are told apart
#: from another run's when both ran on one cluster. Holds no run, plan or client alive.
_HELD: weakref.WeakSet[Run] = weakref.WeakSet()


def record_run(rechunked: Any, result: Any, kept: Collection[str] = ()) -> Run | None:
    """Start measuring the tasks of ``result`` on the active cluster; None without one.

    ``rechunked`` is the input as rechunked for the plan, ``result`` the operator's lazy result
    built from it, ``kept`` the names of its variables that the operator kept unplanned
    (:attr:`Run.beside`). Registers :class:`~.task_peaks.TaskPeaks` on the workers unless the
    dask config key ``memchunk.measure-tasks`` is False.
    """
    import dask

    client = active_client()
    if client is None:
        return None
    inputs = input_layers(rechunked)
    beside, prefixes = beside_layers(result, kept, inputs)
    run = Run(
        time.time(),
        weakref.ref(client),
        inputs,
        input_layers(result) - inputs,
        beside=beside,
        beside_prefixes=prefixes,
    )
    _HELD.add(run)
    if dask.config.get("memchunk.measure-tasks", True):
        from .task_peaks import PLUGIN_NAME, TaskPeaks

        client.register_plugin(TaskPeaks(), name=PLUGIN_NAME)
    return run


def beside_layers(
    result: Any, kept: Collection[str], inputs: frozenset[str] = frozenset()
) -> tuple[frozenset[str], frozenset[str]]:
    """:attr:`Run.beside` and :attr:`Run.beside_prefixes` of ``result``'s ``kept`` variables.

    ``inputs``: the layers of the input as rechunked for the plan, not the operator's either.
    """
    kept = [name for name in kept if name in getattr(result, "data_vars", {})]
    if not kept:
        return frozenset(), frozenset()
    own = input_layers(result.drop_vars(kept))
    beside = frozenset(input_layers(result[kept]) - own - inputs)
    planned = {key_split(n) for n in own}
    return beside, frozenset({key_split(n) for n in beside} - planned)


def _named_after(task: str, names: Collection[str]) -> bool:
    """Whether the task named ``task`` is of a layer named one of ``names`` (no tokens).

    A task Dask fused from several layers is named after them all and the last one's token
    (``broadcast_to-rechunk-merge-store-map-0282...``).
    """
    return any(task.startswith(f"{n}-") or f"-{n}-" in task for n in names)


def _token(name: str) -> str:
    """The last part of a layer's or a task's name: its token.

    A task that Dask fused from several layers is named after them all and ends with the name
    of the one it outputs (``rechunk-merge-rechunk-split-mean_chunk-466f...``).
    """
    return name.rsplit("-", 1)[-1]


def _others(run: Run, client: Any) -> frozenset[str]:
    """Tokens of the layers of the other runs held on ``client``, where not also ``run``'s."""
    tokens: set[str] = set()
    for other in list(_HELD):
        if other is not run and other.client() is client:
            tokens |= {_token(n) for n in other.layers | other.input_layers}
    return frozenset(tokens - {_token(n) for n in run.layers | run.input_layers})


@dataclass
class RunReport:
    """Predicted against measured, for the last run of a plan on a cluster.

    Attributes
    ----------
    operator
        The operator.
    n_tasks
        The operator's tasks measured since ``apply`` built the graph: those it ran, each
        worker's first per thread left out where the worker ran more (on workers with several
        threads, where the period of its first tasks had not ended).
    n_ran, n_layers
        The tasks the graph ran after its input, and the layers they belong to (a reduction
        may run two per planned chunk: its chunk function, and a step that reshapes it).
    n_gathering
        Of those, the tasks left out on workers with several threads because the gather of
        a result (``.compute()`` of a Dataset, a variable at a time), or xarray's task on a
        variable kept unplanned (:attr:`Run.beside`), ran in their period.
    measured_task_bytes
        The measured peak of the operator task furthest above what it was allowed (on workers
        with several threads, the worker's growth shared among its busy threads); None when
        nothing was measured.
    predicted_task_bytes, predicted_peak_bytes, per_task
        What the plan predicted one task runs with (the operator's work and getting its input:
        a read from a file, a halo concatenated, a graph's block produced, where these run
        inside the task), its task slot (with held chunks) and the budget.
    pauses, worker_deaths
        Seen by the scheduler since the graph was built.
    memory_deaths
        Of the deaths, those memory caused while the worker ran an operator task.
    retired_workers
        Workers retired on purpose since the graph was built (an adaptive cluster scaling
        down): their tasks' records left with them.
    runtime_bytes
        The compiled code the measured task loaded as its worker's first (counted apart in the
        plan's slot), included in ``predicted_task_bytes``; 0 when it was not a first task.
    setup_bytes
        The most a worker with several threads kept from the period of its first tasks (its
        setup), which its records in that period were measured without; 0 where none was.
    cache_bytes
        The most a worker's records of a later period were measured without: the netCDF
        chunk caches its tasks filled, which the plan counts in the baseline; 0 where none.
    gathered
        Where the result was computed in one piece (Dask's ``finalize-`` task gathered it) and
        is too large to gather into one worker, the sentence that says so (:attr:`Run.gather`).
    learned
        What the run taught (and where it is kept), or why it taught nothing.
    """

    operator: str
    n_tasks: int
    measured_task_bytes: int | None
    predicted_task_bytes: int
    predicted_peak_bytes: int
    per_task: int
    pauses: int
    worker_deaths: int
    memory_deaths: int = 0
    n_ran: int = 0
    n_layers: int = 0
    retired_workers: int = 0
    n_gathering: int = 0
    runtime_bytes: int = 0
    setup_bytes: int = 0
    cache_bytes: int = 0
    gathered: str = ""
    learned: str = ""
    format: Any = field(default=str, repr=False)

    @property
    def ratio(self) -> float | None:
        """Measured over predicted task peak."""
        if not self.measured_task_bytes or not self.predicted_task_bytes:
            return None
        return self.measured_task_bytes / self.predicted_task_bytes

    def _tasks(self) -> str:
        """The tasks measured, and how they relate to those the graph ran."""
        setup = (
            f"; a worker's first tasks measured without the {self.format(self.setup_bytes)} it "
            f"kept from them (setup)"
            if self.setup_bytes
            else ""
        )
        if self.cache_bytes:
            setup += (
                f"; later ones without up to {self.format(self.cache_bytes)} of netCDF chunk "
                f"caches their reads filled (counted in the baseline)"
            )
        if self.n_ran <= self.n_tasks and self.n_layers <= 1:
            return f"{self.n_tasks} ({setup[2:]})" if setup else str(self.n_tasks)
        layers = f"{self.n_layers} layer{'' if self.n_layers == 1 else 's'}"
        first = "; each worker's first task per thread left out" * (
            self.n_ran - self.n_gathering > self.n_tasks
        )
        gathering = (
            f"; {self.n_gathering} that ran beside a gather of the result, or beside xarray's "
            f"tasks on a variable kept unplanned, left out"
            if self.n_gathering
            else ""
        )
        return (
            f"{self.n_tasks} (of {self.n_ran} the graph ran after its input, in {layers}{first}"
            f"{gathering}{setup})"
        )

    def explain(self) -> str:
        """A few lines: predicted and measured, what the cluster went through, what was learned."""
        size = self.format
        if self.measured_task_bytes is None and self.retired_workers:  # records left with them
            measured = (
                f"not measured: {self.retired_workers} worker(s) retired since the run started "
                f"(an adaptive cluster scaling down) took their tasks' records with them; call "
                f"report() right after computing the result"
            )
        elif self.measured_task_bytes is None:  # no record at all: nothing has run yet
            measured = "not measured: no task of this run has ended yet (compute the result first)"
        elif self.measured_task_bytes == 0:  # e.g. a multi-threaded worker's shared growth
            measured = (
                "below what the plan counts beside each task (held and gathered chunks): the "
                "workers' growth, shared among their busy threads, was smaller"
            )
        else:
            ratio = self.ratio
            measured = size(self.measured_task_bytes) + (
                f" (x{ratio:.2f} the prediction)" if ratio is not None else ""
            )
        deaths = f"{self.worker_deaths}"
        if self.worker_deaths:
            deaths += f" ({self.memory_deaths} from memory in an operator task)"
        rows = [
            ("operator", self.operator),
            ("tasks measured", self._tasks()),
            (
                "predicted task peak",
                size(self.predicted_task_bytes)
                + (
                    f" (with {size(self.runtime_bytes)} of compiled code its worker loaded with "
                    f"this, its first task)"
                    if self.runtime_bytes
                    else ""
                ),
            ),
            ("measured task peak", measured),
            (
                "task slot",
                f"{size(self.predicted_peak_bytes)} predicted of {size(self.per_task)} budget",
            ),
            ("pauses, worker deaths", f"{self.pauses}, {deaths}"),
        ]
        if self.gathered:
            blamed = (
                " (the pauses and deaths above may be this, not the operator's tasks)"
                if self.pauses or self.worker_deaths
                else ""
            )
            rows.append(("result gathered", self.gathered + blamed))
        rows.append(("learned", self.learned))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __str__(self) -> str:
        return self.explain()


@dataclass(frozen=True)
class _Events:
    pauses: int
    deaths: int
    memory_deaths: int
    retired: int = 0


def _events(
    client: Any, moment: float, inputs: frozenset[str], until: float = float("inf")
) -> _Events:
    """Pauses and worker removals since ``moment`` (and up to ``until``).

    The removals: deaths, those memory caused in our tasks, and workers retired on purpose
    (an adaptive cluster scaling down).
    """
    from .task_peaks import key_name

    pauses, deaths, memory_killed, in_operator, retired = set(), set(), set(), set(), set()
    for topic, entries in client.get_events().items():
        for stamp, msg in entries:
            if stamp < moment or stamp > until:
                continue
            if is_pause_event(msg):
                pauses.add((topic, stamp))
            restarted = memory_restart(topic, msg)
            if restarted:
                memory_killed.add(restarted)
            removal = worker_removal(topic, msg)
            if removal is None:
                continue
            if removal.expected:  # retired on purpose: no death
                retired.add(removal.worker)
                continue
            deaths.add((removal.worker, stamp))
            if any(key_name(k) not in inputs for k in removal.processing):
                in_operator.add(removal.worker)
    memory = {(w, s) for w, s in deaths if w in memory_killed and w in in_operator}
    return _Events(len(pauses), len(deaths), len(memory), len(retired))


class _Measured(NamedTuple):
    """An operator task's record, and whether it was its worker's first (per thread)."""

    record: TaskRecord
    first: bool


def _warm(records: list[TaskRecord]) -> list[_Measured]:
    """A worker's operator records without the setup of its first tasks, where it ran more.

    The first task a worker runs pays for what it imports and sets up once (a random
    generator, BLAS threads, an import inside the function: 30 MB measured for a task of
    0.8 MB; compiled groupby kernels); it says nothing of the operator's model. A worker that
    ran no more than one task per thread keeps its records, marked as first: they loaded the
    operator's compiled code, which the plan counts apart.

    A single-threaded worker that ran more is measured without its first task. On a worker
    with several threads a record is its period's growth (:class:`~.task_peaks.TaskRecord`),
    and the period that ran the worker's first tasks holds their setup in all its records (a
    worker busy throughout runs one period): they are measured less what that period retained
    once its threads were idle (:attr:`~.task_peaks.TaskRecord.retained`). Measured so, an
    anomaly (a user's function of ``groupby``) of four yearly netCDF files opened with
    ``open_mfdataset``, on 2 fresh workers x 2 threads x 700 MB, whose first tasks loaded
    about 105 MiB of kernels and caches, took x0.89-0.99 its prediction in 3 runs where it had
    read x1.55-1.66 (and learned that); x0.90-0.91 on 1 thread. Up to
    :data:`~.task_peaks.TRIM_ABOVE` of what the period kept stays in the measure (freed pages
    glibc may hold: :func:`_setup_left_out`). Where that period has not ended, the first task per
    thread is left out.
    """
    ordered = sorted(records, key=lambda r: r.ended)
    threads = ordered[0].threads if ordered else 1
    if len(ordered) <= threads:
        return [_Measured(r, first=True) for r in ordered]
    setup = _setup_left_out(ordered)
    if setup is None:
        return [_Measured(r, first=False) for r in ordered[threads:]]
    period = ordered[0].period
    return [
        _Measured(
            r._replace(peak_bytes=max(0, r.peak_bytes - setup)) if r.period == period else r,
            first=False,
        )
        for r in ordered
    ]


def _without_caches(
    measured: list[_Measured], caches: int, setup: int
) -> tuple[list[_Measured], int]:
    """A worker's records (of several threads) without the chunk caches its tasks filled.

    The plan counts ``caches`` (:attr:`~xarray_memchunk.Budget.filled_while_running`) in the
    worker's baseline, and they stay in the worker once filled. A record on a worker with
    several threads is its growth while its threads were busy, the reads of the input's
    tasks that ran beside included: a new user's ``groupby`` on 2 threads measured 47.74 MiB
    against 16.80 MiB predicted (and learned that), where one of ``h5netcdf`` files, which
    keep no caches, measured 8.47 MiB. So each measuring period's records are measured
    without what it retained once its threads were idle, up to ``caches`` over the worker's
    periods, less the ``setup`` its first period's records were measured without already
    (:func:`_warm`). A period that has not ended, and a single-threaded worker's records (a
    task's own peak), keep theirs.

    Returns
    -------
    tuple
        The records, and the most taken out of any of them.
    """
    first = min((m.record for m in measured), key=lambda r: r.ended, default=None)
    if not caches or first is None or first.threads == 1:
        return measured, 0
    left = max(0, caches - setup)
    cuts: dict[int, int] = {}
    for m in sorted(measured, key=lambda m: m.record.ended):
        period, retained = m.record.period, m.record.retained
        if period in cuts or period == first.period or retained is None:
            continue
        cuts[period] = min(retained, left)
        left -= cuts[period]
    without = [
        m._replace(record=m.record._replace(peak_bytes=max(0, m.record.peak_bytes - cut)))
        if (cut := cuts.get(m.record.period, 0))
        else m
        for m in measured
    ]
    return without, max(cuts.values(), default=0)


def _gathered(record: TaskRecord) -> bool:
    """Whether ``record`` is Dask's gather of a computed result into one array.

    A ``finalize-`` task whose result is over ``ABSOLUTE_SLACK`` (4 MiB): xarray's
    ``to_zarr`` also ends in ``finalize-`` tasks, whose results are nothing.
    """
    return record.name.startswith(FINALIZE_PREFIXES[0]) and record.result_bytes > ABSOLUTE_SLACK


def _clear_of_gathers(
    ran: list[TaskRecord],
    every: list[TaskRecord],
    beside: Callable[[str], bool] = lambda name: False,
) -> list[TaskRecord]:
    """A worker's operator records ``ran``, less those its gathers of a result inflated.

    On a worker with several threads a record is its period's growth, and a ``finalize-``
    task that ran in the period (Dask concatenating one variable of a Dataset computed with
    ``.compute()``, while the others' tasks still run) holds its pieces and their whole there:
    the operator's records that end after it began carry them. A trial's rolling mean of three
    variables, 2 workers x 2 threads, read x1.33-1.69 computed so and x0.86-0.92 written. So
    does xarray's task on a kept variable (``beside`` of its name: :meth:`Run.is_beside`).
    They are left out where the worker has others; kept where it has none (and, in
    :func:`report`, a layer's where no worker has another of it). ``every``: all the worker's
    records of the run.
    """
    gathers = [
        (r.period, r.ended - r.seconds)
        for r in every
        if r.period and (_gathered(r) or beside(r.name))
    ]
    if not gathers:
        return ran
    clear = [r for r in ran if not any(r.period == p and r.ended > b for p, b in gathers)]
    return clear or ran


def _run_end(records: list[TaskRecord], run: Run) -> float:
    """When the run's computation ended: the first gather or store closing after its tasks.

    The run's tasks are those of its result's own layers, and of every layer (not its input's)
    that ran a task before the run closed: an operator step fused into what follows
    (``apply(...).mean("lat")``: ``getitem-mean_chunk-...``) is named after it. The first
    ``finalize-`` or ``_finalize_store-`` task to end after the last of them closed the
    computation (``.compute()``, ``to_zarr``); where a task of a layer that ran before ends
    after it (a Dataset computed a variable at a time), or a task of the result's own graph
    (a name of one of its layers in the task's) that started after the run did and before
    that end finishes after it, the end moves past that task. A Dataset's small variable
    gathered first does not close the run while its other tasks run: a mask's ``finalize-``
    ended at 0.03 s, while a 3-D depth field's broadcast (``broadcast_to-...``) ran until
    0.92 s and the operator's tasks, fused into the ``.mean()`` that followed
    (``mean_chunk-``), from 0.92 s to 1.26 s, and none of them was counted. What ran after,
    or beside it without a name of the result's (another computation on the cluster, though
    it reads the same input: a trial's ``open_mfdataset(...).load()`` was counted, 4530 tasks
    and its pauses; a ``client.submit`` running meanwhile) is not the run's. Where no task
    of the result's own layers ran (all fused into a later step's), or nothing closed after
    them yet, no end is known: infinity.
    """
    own = {key_split(name) for name in run.layers}
    last = max((r.ended for r in records if r.name in run.layers), default=None)
    until = float("inf")
    while last is not None:
        closed = [r.ended for r in records if r.name.startswith(FINALIZE_PREFIXES)]
        until = min((t for t in closed if t >= last), default=float("inf"))
        ran = {
            r.name
            for r in records
            if r.ended <= until
            and r.name not in run.input_layers
            and not r.name.startswith(FINALIZE_PREFIXES)
        }
        late = [
            r.ended
            for r in records
            if r.ended > until
            and (
                r.name in ran
                or (run.started <= r.ended - r.seconds < until and _named_after(r.name, own))
            )
        ]
        last = max(late, default=None)
    return until


def _setup_left_out(records: list[TaskRecord]) -> int | None:
    """What :func:`_warm` measures a worker's records without: its first period's setup.

    What that period kept beyond :data:`~.task_peaks.TRIM_ABOVE`: a period that kept up to it
    was read untrimmed, and that much may be freed memory glibc holds, which stays in the
    measure, never out of it. None where nothing is left out so: a single-threaded worker,
    one that ran no more than one task per thread, or a first period that has not ended.
    """
    from .task_peaks import TRIM_ABOVE

    if not records:
        return None
    first = min(records, key=lambda r: r.ended)
    if first.threads == 1 or len(records) <= first.threads or first.retained is None:
        return None
    return max(0, first.retained - TRIM_ABOVE)


def _in_task(plan: ChunkPlan) -> int:
    """What may run inside one task: the operator's work and getting its input.

    Getting the input is reading it from a file or concatenating its pieces, and producing it
    where Dask fuses a graph's block into the operator's task (the plan's chunks are the
    graph's own).
    """
    return plan.predicted_task_bytes + plan.gather_bytes + plan.produce_bytes


class _Peak(NamedTuple):
    """One operator task's measured peak, and what it may take beside its prediction.

    ``runtime``: the compiled code a single-threaded worker's first task loads, which the plan
    counts apart in its slot (``plan.runtime_bytes``); ``allowance``: once-only setup (imports)
    of a worker's first task, and on a worker with several threads its share of the runtime
    beyond what the slot counts per thread.
    """

    peak_bytes: int
    runtime: int = 0
    allowance: int = 0


def _limit(plan: ChunkPlan, peak: _Peak) -> float:
    """What ``peak`` may reach before it counts as above its prediction."""
    predicted = _in_task(plan) + peak.runtime
    return predicted * (1 + TOLERANCE) + ABSOLUTE_SLACK + peak.allowance


def _peak_of(record: TaskRecord, first: bool, plan: ChunkPlan) -> _Peak:
    """A record's :class:`_Peak` under ``plan``.

    A first task's once-only setup is allowed up to :data:`FIRST_TASK_BYTES`, and no more
    than the slot leaves unused: setup the slot has no room for is evidence like any excess.
    A multi-threaded worker's record is its growth while its threads were busy, shared among
    the ``overlap`` tasks, less the held and gathered chunks and the runtime the plan counts
    beside each task (``runtime / threads``); where it was a worker's first, the runtime and
    setup were loaded once for all the tasks that overlapped.
    """
    room = max(0, plan.budget.per_task - plan.predicted_peak_bytes)
    setup = min(FIRST_TASK_BYTES, room) if first else 0
    if record.threads == 1:
        return _Peak(record.peak_bytes, plan.runtime_bytes if first else 0, setup)
    # Dask's record of the tasks sent before the first ran is in the RSS the growth starts from
    slot_extra = max(0, plan.predicted_peak_bytes - _in_task(plan) - plan.graph_bytes)
    runtime = plan.runtime_bytes * plan.budget.threads_per_worker  # per worker, loaded once
    share = int(max(0, record.peak_bytes / record.overlap - slot_extra))
    loaded = (runtime + setup) / record.overlap - plan.runtime_bytes if first else 0
    return _Peak(share, 0, int(max(0, loaded)))


def _measured_task(measured: list[_Measured], plan: ChunkPlan) -> _Peak | None:
    """The operator task whose peak exceeds its :func:`_limit` the most; None: none measured."""
    peaks = [_peak_of(r, first, plan) for r, first in measured]
    return max(peaks, key=lambda p: p.peak_bytes - _limit(plan, p)) if peaks else None


def report(run: Run, prepared: Any, learn: bool = True) -> RunReport:
    """Compare ``run`` on its cluster with the prediction of the plan it ran, and learn from it.

    ``prepared`` is what planning resolved (its ``plan``, a :class:`ChunkPlan`, and the
    variables' ``costs``); ``plan.report()`` passes its own and its last run.

    Raises
    ------
    MemchunkError
        When the run's client is gone (closed and released): report before closing it.
    """
    from ..errors import MemchunkError

    plan = prepared.plan
    client = run.client()
    if client is None:
        raise MemchunkError(
            f"the client this {plan.operator!r} plan ran on is gone: report the run before "
            f"closing its cluster"
        )
    others = _others(run, client)
    # a worker killed or restarting as the report asks is left out: its records died with it,
    # and the scheduler's events say it was killed
    answers = client.run(_worker_records, run.started, on_error="ignore")
    until = _run_end([r for records in answers.values() for r in records], run)
    answers = {w: [r for r in records if r.ended <= until] for w, records in answers.items()}
    ran = [  # each worker's operator tasks
        [
            r
            for r in records
            if r.name not in run.input_layers
            and not r.name.startswith(FINALIZE_PREFIXES)
            and _token(r.name) not in others
            and not run.is_beside(r.name)
        ]
        for records in answers.values()
    ]
    clean = [
        _clear_of_gathers(w, rs, run.is_beside) for w, rs in zip(ran, answers.values(), strict=True)
    ]
    kept = {r.name for worker in clean for r in worker}  # no layer left out everywhere
    clean = [
        [r for r in w if r in c or r.name not in kept] for w, c in zip(ran, clean, strict=True)
    ]
    caches = plan.budget.filled_while_running
    setups = [_setup_left_out(worker) or 0 for worker in clean]
    warmed = [_without_caches(_warm(w), caches, s) for w, s in zip(clean, setups, strict=True)]
    records = [r for worker, _ in warmed for r in worker]
    setup = max(setups, default=0)
    cached = max((cut for _, cut in warmed), default=0)
    computed = any(_gathered(r) for w in answers.values() for r in w)
    events = _events(client, run.started, run.input_layers, until + EVENTS_AFTER_END_S)
    peak = _measured_task(records, plan)
    floor = False
    if events.memory_deaths:  # the task that killed a worker left no record: at least that
        terminate = memory_threshold("terminate", otherwise=0.95)
        # what killed the worker, shared among the tasks its threads ran
        worker = terminate * plan.budget.worker_memory - plan.budget.worker_baseline
        killed = int(worker / max(1, plan.budget.threads_per_worker))
        floor = peak is None or killed > peak.peak_bytes
        if floor:
            peak = _Peak(killed)
    measured = peak.peak_bytes if peak is not None else None
    result = RunReport(
        operator=plan.operator,
        n_tasks=len(records),
        n_ran=sum(map(len, ran)),
        n_gathering=sum(map(len, ran)) - sum(map(len, clean)),
        n_layers=len({r.name for worker in ran for r in worker}),
        measured_task_bytes=measured,
        predicted_task_bytes=_in_task(plan) + (peak.runtime if peak else 0),
        runtime_bytes=peak.runtime if peak else 0,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        per_task=plan.budget.per_task,
        pauses=events.pauses,
        worker_deaths=events.deaths,
        memory_deaths=events.memory_deaths,
        retired_workers=events.retired,
        setup_bytes=setup,
        cache_bytes=cached,
        gathered=run.gather if computed else "",
        format=plan.budget.format,
    )
    # what a worker kept, less the chunk caches the baseline counts apart; not where another
    # run's tasks on this client may have shared the period
    kept_setup = max(0, setup - caches)
    paused = bool(events.pauses or events.memory_deaths)
    kept_note = _learn_kept(prepared, kept_setup, paused) if learn and not others else ""
    over = peak is not None and peak.peak_bytes > _limit(plan, peak)
    if kept_note and not over:
        result.learned = kept_note
        if events.deaths > events.memory_deaths:
            result.learned += "; deaths not caused by memory in an operator task are not evidence"
    elif not over:
        once = (
            f", and {plan.budget.format(peak.allowance)} once in a worker's first task"
            if peak is not None and peak.allowance
            else ""
        )
        result.learned = (
            f"nothing: every operator task within its prediction and the measurement's "
            f"tolerance ({TOLERANCE:.0%} + {plan.budget.format(ABSOLUTE_SLACK)}{once})"
            if measured is not None
            else "nothing: no operator task measured"
        )
        if events.deaths > events.memory_deaths:
            result.learned += "; deaths not caused by memory in an operator task are not evidence"
    elif not learn:
        result.learned = "nothing (learn=False)"
    else:
        try:
            result.learned = _learn(prepared, peak.peak_bytes - peak.runtime, floor)
        except CalibrationError as exc:  # a read-only learned file, an unwritable directory
            result.learned = f"nothing: {exc}"
        if kept_note:
            result.learned = f"{kept_note}; and {result.learned}"
    return result


def _learn_kept(prepared: Any, setup: int, paused: bool) -> str:
    """Keep what a worker kept from its first tasks, where calibrating measured less.

    Self-calibration records what its runs raised the measuring process's memory by; measured
    in a worker that had imported the function's libraries for earlier work (a flox groupby
    before it), that is less than a fresh worker keeps, and a plan that counted it paused its
    workers (25 pauses in a run whose every task was within its prediction). ``setup`` is
    what a worker with several threads kept from the period of its first tasks
    (:func:`_setup_left_out`). Where it is above the calibration's rise by more than
    :data:`~xarray_memchunk.models.fitting.ABSOLUTE_SLACK`, it is kept beside the calibration
    (:func:`~xarray_memchunk.models.learned.record_kept`), and the next plan's baseline counts
    it. The caller passes ``setup`` less the netCDF chunk caches the baseline counts apart
    (:attr:`~xarray_memchunk.planning.budget.Budget.filled_while_running`), and learns
    nothing so where another run's tasks on the client may have shared the period.

    Parameters
    ----------
    prepared
        What planning resolved (its ``plan`` and the variables' ``costs``).
    setup
        What a worker kept from its first tasks, in bytes.
    paused
        Whether a worker paused or memory killed one in the run. A figure kept already is
        raised only then: what a worker keeps after its first tasks varies from run to run
        (a trial's 77.87, 91.07 and 104.01 MiB in three runs of smaller and smaller tasks,
        none paused after the first), and raising it on each run would refuse each stated
        minimum on the next plan.

    Returns
    -------
    str
        What was learned, or an empty string.
    """
    plan = prepared.plan
    for cost in prepared.costs.values():
        rise = _calibrated_rise(cost)
        if rise is None or setup <= rise + ABSOLUTE_SLACK:
            continue
        try:
            known = load_kept(cost.calibration_key, cost.device)
            if known is not None and (not paused or setup <= known + ABSOLUTE_SLACK):
                continue
            path = record_kept(cost.calibration_key, cost.device, setup)
        except CalibrationError as exc:
            return f"nothing of what a worker kept: {exc}"
        size = plan.budget.format
        return (
            f"a worker kept {size(setup)} after its first tasks, where calibrating "
            f"{plan.operator!r} measured {size(rise)}: the next plan counts it in the baseline "
            f"(forget it with {forget_command(cost.calibration_key)}): {path}"
        )
    return ""


def _calibrated_rise(cost: Any) -> int | None:
    """What self-calibration measured running the operator raise its process's memory by."""
    calibration = cost.calibration
    return None if calibration is None else calibration.held_after_running(0)


def _learn(prepared: Any, measured: int, floor: bool) -> str:
    """Keep the measured task beside the calibration of the variable that sets the prediction.

    The plan predicts the largest task over its variables, and the largest measured task is
    compared with it: the observation belongs to that variable (the others' smaller tasks say
    nothing of their own models). ``floor``: ``measured`` is only what killed a worker, a floor
    under the task's peak; a self-calibrating operator is then measured again on its next plan.
    """
    plan = prepared.plan

    def padded(cost: Any) -> dict[str, np.ndarray]:
        return {
            d: np.array(
                [padded_extent(plan.chunks[d], len(plan.dask_chunks[d]), plan.halo.get(d, 0))]
            )
            for d in cost.dims
        }

    def predicted(cost: Any) -> float:
        return float(np.asarray(cost.peak_bytes(padded(cost))).reshape(-1)[0])

    cost = max(prepared.costs.values(), key=predicted)
    features = cost.features(padded(cost))
    observation = Observation(
        features={k: float(np.asarray(v).reshape(-1)[0]) for k, v in features.items()},
        # the operator's part: where getting its input ends before its work, not less that
        measured_bytes=operator_peak_within(
            prepared.problem, plan.budget, plan.dask_chunks, measured
        ),
        predicted_bytes=predicted(cost),
        floor=floor,
    )
    path = record_observation(cost.calibration_key, cost.device, cost.dtype.name, observation)
    what = "at least" if floor else "the measured"
    return (
        f"kept {what} {plan.budget.format(measured)} task beside the calibration "
        f"(the next plan raises its prediction, at most x2; forget it with "
        f"{forget_command(cost.calibration_key)})"
        + (
            ": a worker was killed; an operator that measures itself (a function, groupby) is "
            "measured again on its next plan"
            if floor
            else ""
        )
        + f": {path}"
    )

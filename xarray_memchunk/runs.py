"""Measure the tasks of a planned run on a Dask cluster, report them, and learn from them.

``apply`` on a ``distributed`` cluster registers
:class:`~xarray_memchunk.task_peaks.TaskPeaks` on the workers (once) and remembers the plan and
when its graph was built. Each single-threaded worker then records every task's peak as the
profiler measures it (the kernel's high-water mark, reset when the task starts: every
allocation counts, C libraries' included). After the computation, :func:`report`
(``plan.report()``) gathers the tasks that ran since and the scheduler's events (pauses, worker
deaths), and compares them with the plan's prediction.

Tasks are attributed by time, not by name: Dask fuses the plan's tasks with what follows them
(``apply(...).sum()`` runs each sum in the operator's task, named after the sum), and tagging
them would stop that fusion, which is part of what a task holds. Other computations on the
cluster between ``apply`` and ``report`` are counted too: report before starting another.

Measuring is on by default; the dask config key ``memchunk.measure-tasks`` (False) turns it
off. Its cost is two reads of ``/proc/self/status`` and one write to ``/proc/self/clear_refs``
per task (``benchmarks/task_measurement_overhead.py``).

Learning: where the measured task peak exceeds the prediction, or a worker was paused or
killed, the operator's user calibration is updated with the measured task so that the next
plan on the same data is safe: refitted with every profile it has, and never below the model
it had (coefficients and intercept only grow). A killed worker's task left no record: its peak
is taken as at least what killed the worker (the terminate threshold, less the baseline), and
that is a floor, not a measurement: the calibration is marked ``lower_bound`` and the next plan
measures the operator in a worker first (:func:`~xarray_memchunk.calibrate.self_calibrate`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .clusters import active_client
from .models.calibration import load_calibration, save_calibration
from .models.fitting import ABSOLUTE_SLACK, fit_linear
from .planning.candidates import padded_extent
from .planning.plan import ChunkPlan

__all__ = ["PLUGIN_NAME", "RunReport", "report", "signature", "track"]

#: Name of the worker plugin that measures tasks (:class:`~.task_peaks.TaskPeaks`).
PLUGIN_NAME = "memchunk-task-peaks"

#: A measured task peak counts as above the prediction past this fraction (and
#: :data:`~xarray_memchunk.models.fitting.ABSOLUTE_SLACK` bytes: allocator noise).
TOLERANCE = 0.05


def _worker_records(moment: float, dask_worker: Any = None) -> list:
    plugin = getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
    return plugin.since(moment) if plugin is not None else []


@dataclass
class _Tracked:
    """A plan ``apply`` built a graph for: what :func:`report` needs to find its tasks."""

    plan: ChunkPlan
    prepared: Any
    started: float
    client: Any


_TRACKED: dict[tuple, _Tracked] = {}


def signature(plan: ChunkPlan) -> tuple:
    """What identifies a plan between ``plan()`` and ``apply()``: operator, chunks, prediction."""
    chunks = tuple(sorted((d, tuple(c)) for d, c in plan.dask_chunks.items()))
    return (plan.operator, chunks, plan.predicted_task_bytes)


def track(plan: ChunkPlan, prepared: Any) -> None:
    """Remember when ``apply`` built ``plan``'s graph, and measure tasks on the active cluster."""
    import dask

    client = active_client()
    if client is None:
        return
    _TRACKED[signature(plan)] = _Tracked(plan, prepared, time.time(), client)
    if not dask.config.get("memchunk.measure-tasks", True):
        return
    from .task_peaks import TaskPeaks

    client.register_plugin(TaskPeaks(), name=PLUGIN_NAME)


@dataclass
class RunReport:
    """Predicted against measured, for the last run of a plan on a cluster.

    Attributes
    ----------
    operator
        The operator.
    n_tasks
        Tasks measured since ``apply`` built the graph (single-threaded workers only).
    measured_task_bytes
        Largest measured task peak; None when nothing was measured.
    predicted_task_bytes, predicted_peak_bytes, per_task
        The plan's task prediction, its task slot (with gathered and held chunks) and budget.
    pauses, worker_deaths
        Seen by the scheduler since the graph was built.
    learned
        What the run changed in the calibration, or why it changed nothing.
    """

    operator: str
    n_tasks: int
    measured_task_bytes: int | None
    predicted_task_bytes: int
    predicted_peak_bytes: int
    per_task: int
    pauses: int
    worker_deaths: int
    learned: str = ""
    format: Any = field(default=str, repr=False)

    @property
    def ratio(self) -> float | None:
        """Measured over predicted task peak."""
        if not self.measured_task_bytes or not self.predicted_task_bytes:
            return None
        return self.measured_task_bytes / self.predicted_task_bytes

    def explain(self) -> str:
        """A few lines: predicted and measured, what the cluster went through, what was learned."""
        size = self.format
        measured = (
            f"{size(self.measured_task_bytes)} (x{self.ratio:.2f} the prediction)"
            if self.measured_task_bytes is not None
            else "not measured (no single-threaded worker ran its tasks)"
        )
        rows = [
            ("operator", self.operator),
            ("tasks measured", str(self.n_tasks)),
            ("predicted task peak", size(self.predicted_task_bytes)),
            ("measured task peak", measured),
            (
                "task slot",
                f"{size(self.predicted_peak_bytes)} predicted of {size(self.per_task)} budget",
            ),
            ("pauses, worker deaths", f"{self.pauses}, {self.worker_deaths}"),
            ("learned", self.learned),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __str__(self) -> str:
        return self.explain()


def _events(client: Any, moment: float) -> tuple[int, int]:
    """Pauses and worker removals the scheduler logged since ``moment``."""
    pauses, deaths = set(), set()
    for topic, entries in client.get_events().items():
        for stamp, msg in entries:
            if stamp < moment or not isinstance(msg, dict):
                continue
            if msg.get("action") == "worker-status-change" and msg.get("status") == "paused":
                pauses.add((topic, stamp))
            if topic == "all" and msg.get("action") == "remove-worker":
                deaths.add((str(msg.get("worker")), stamp))
    return len(pauses), len(deaths)


def report(plan: ChunkPlan, learn: bool = True) -> RunReport:
    """Compare the last run of ``plan`` on the cluster with its prediction, and learn from it.

    Raises
    ------
    MemchunkError
        When ``apply`` built no graph for this plan on a cluster in this process.
    """
    from .errors import MemchunkError

    tracked = _TRACKED.get(signature(plan))
    if tracked is None:
        raise MemchunkError(
            f"no run of this {plan.operator!r} plan to report: apply it on a distributed "
            f"cluster and compute the result first"
        )
    records = [
        r
        for worker in tracked.client.run(_worker_records, tracked.started).values()
        for r in worker
    ]
    pauses, deaths = _events(tracked.client, tracked.started)
    measured = max((r[1] for r in records), default=None)
    result = RunReport(
        operator=plan.operator,
        n_tasks=len(records),
        measured_task_bytes=measured,
        predicted_task_bytes=plan.predicted_task_bytes,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        per_task=plan.budget.per_task,
        pauses=pauses,
        worker_deaths=deaths,
        format=plan.budget.format,
    )
    floor = False
    if deaths:  # the task that killed a worker left no record: at least what killed it
        killed = int(0.95 * plan.budget.worker_memory - plan.budget.worker_baseline)
        floor = killed > (measured or 0)
        measured = max(measured or 0, killed)
    seconds = float(np.median([r[2] for r in records])) if records else 0.0
    limit = plan.predicted_task_bytes * (1 + TOLERANCE) + ABSOLUTE_SLACK
    over = measured is not None and measured > limit
    if not over:
        result.learned = "nothing: the model held" if measured else "nothing: no measurement"
    elif not learn:
        result.learned = "nothing (learn=False)"
    else:
        result.learned = _learn(tracked, measured, seconds, len(records), floor)
    return result


def _learn(tracked: _Tracked, measured: int, seconds: float, runs: int, floor: bool) -> str:
    """Grow each planned variable's calibration so that it covers the measured task.

    ``floor``: ``measured`` is only what killed a worker, a floor under the task's peak. The
    calibration is grown to it and marked ``lower_bound``, so that the next plan measures the
    operator (:func:`~xarray_memchunk.calibrate.self_calibrate`) instead of trusting it.
    """
    prepared = tracked.prepared
    operator, kwargs, plan = prepared.operator, prepared.kwargs, tracked.plan
    written = []
    for cost in prepared.costs.values():
        padded = {
            d: padded_extent(plan.chunks[d], len(plan.dask_chunks[d]), plan.halo.get(d, 0))
            for d in cost.dims
        }
        features = cost.features({d: np.array([padded[d]]) for d in cost.dims})
        run = {
            "extents": {d: int(plan.chunks[d]) for d in cost.dims},
            "sizes": dict(cost.sizes),
            "features": {k: float(np.asarray(v).reshape(-1)[0]) for k, v in features.items()},
            "peak_bytes": int(measured),
            "seconds": seconds,
            "runs": runs,
            "method": "run, a worker killed: at least this" if floor else "run",
        }
        key = operator.cost_terms(**kwargs).calibration
        known = load_calibration(key, cost.device, cost.dtype.name)
        profiles = [*(known.profiles if known else ()), run]
        if len(profiles) >= 2:  # refit on everything measured
            rows = [_features(operator, known, cost.dtype.name, p) for p in profiles]
            fit = fit_linear(
                {k: np.array([r.get(k, 0.0) for r in rows]) for k in rows[-1]},
                np.array([p["peak_bytes"] for p in profiles]),
            )
            model = {"coefficients": fit.coefficients, "intercept": fit.intercept}
            stats = {"n_profiles": fit.n_profiles, "median_abs_pct_error": fit.median_abs_pct_error}
        else:  # a model measured on nothing before: scaled up to this run
            scale = measured / max(1, plan.predicted_task_bytes)
            model = {
                "coefficients": {k: v * scale for k, v in cost.model.coefficients.items()},
                "intercept": cost.model.intercept * scale,
            }
            stats = {"n_profiles": 1}
        record = model | {
            "seconds_per_element": known.seconds_per_element if known else cost.seconds_per_element,
            "fit": stats,
            "profiles": profiles,
        }
        record = _never_below(record, cost.model)
        record["fit"]["lower_bound"] = floor
        if cost.max_task_elements:
            elements = float(np.prod(list(padded.values()), dtype=float))
            record["fit"]["max_task_elements"] = max(cost.max_task_elements, elements)
        path = save_calibration(key, cost.device, {cost.dtype.name: record}, {"learned": True})
        written.append(str(path))
    what = "at least" if floor else "the measured"
    return (
        f"calibration grown to cover {what} {plan.budget.format(measured)} task"
        + (" (a worker was killed: the next plan measures the operator first)" if floor else "")
        + ": "
        + ", ".join(written)
    )


def _features(operator: Any, known: Any, dtype: str, profile: Mapping[str, Any]) -> dict:
    """A profile's features: recorded with it (a run's), or computed as calibration did."""
    if "features" in profile:
        return dict(profile["features"])
    from .calibrate import features_of

    stored = dict(known.metadata.get("operator_kwargs", {})) if known else {}
    kwargs = operator.normalize_kwargs(**(dict(operator.calibration_kwargs) | stored))
    return features_of(operator, profile["extents"], dtype, kwargs, profile.get("sizes"))


def _never_below(record: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """``record`` with each coefficient and the intercept at least the current model's."""
    coefficients = dict(record["coefficients"])
    for name, value in model.coefficients.items():
        coefficients[name] = max(float(value), float(coefficients.get(name, 0.0)))
    intercept = max(float(model.intercept), float(record["intercept"]))
    return dict(record) | {"coefficients": coefficients, "intercept": intercept}

"""The seed experiment, runnable: GST3D with Dask auto chunks, manual chunks and memchunk.

For GST3D on a synthetic volume and a ``LocalCluster`` with a per-worker ``memory_limit``, each
case runs on a fresh cluster and records: completed or failed (and how), wall time,
peak RSS per worker (sampled), pauses, worker deaths, task count and the predicted peak per
task of the chunks used. ``memchunk demo`` and ``benchmarks/gst3d_experiment.py`` run it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ..datasets import synthetic_seismic
from ..errors import InfeasiblePlanError
from ..units import format_bytes, to_bytes
from .diagnostics import RunOutcome, run_watched

__all__ = ["Case", "format_table", "plot_memory", "run_gst3d_experiment"]


@dataclass(frozen=True)
class Case:
    """One way of chunking: ``chunks`` as ``.chunk()`` takes them, or None to let memchunk plan."""

    label: str
    chunks: object


def default_cases(manual_sizes: Sequence[int], auto: bool = True) -> list[Case]:
    """Dask auto chunks, a grid of cubic manual chunk sizes, and memchunk's plan."""
    cases = [Case("dask auto", "auto")] if auto else []
    cases += [Case(f"manual {n}^3", n) for n in manual_sizes]
    cases.append(Case("memchunk", None))
    return cases


def run_gst3d_experiment(
    shape: tuple[int, int, int] = (200, 200, 200),
    *,
    memory_limit: str = "1.5GB",
    n_workers: int = 2,
    threads_per_worker: int = 1,
    cases: Sequence[Case] | None = None,
    dtype: str = "float32",
    repeats: int = 1,
    quiet: bool = True,
) -> list[RunOutcome]:
    """Run every case of GST3D, each run on a fresh ``LocalCluster``, and return the outcomes.

    A case whose plan is refused before running (:class:`InfeasiblePlanError`) is recorded as
    not completed, with that error, and nothing runs for it.

    Parameters
    ----------
    shape
        Volume (inline, crossline, sample).
    memory_limit
        Per-worker memory limit, as ``LocalCluster(memory_limit=...)`` takes it.
    n_workers, threads_per_worker
        Cluster size.
    cases
        Chunkings to compare; :func:`default_cases` of 50, 64, 100, 128, 200 by default.
    dtype
        Amplitude dtype.
    repeats
        Runs per case; the outcome kept is the median-time run of the completed ones (a case
        that failed once is reported as failed). Runs are interleaved across cases so that
        drifts in machine load hit every case alike.
    quiet
        Silence the worker-restart warnings distributed logs for failing cases.
    """
    import dask
    from distributed import Client, LocalCluster

    cases = list(cases) if cases is not None else default_cases((50, 64, 100, 128, 200))
    if quiet:
        for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    outcomes = []
    runs: dict[str, list[RunOutcome]] = {}
    for case in [c for _ in range(repeats) for c in cases]:
        # a fresh cluster per run: no memory, events or restarts carried from the last case
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 3}),
            LocalCluster(
                n_workers=n_workers,
                threads_per_worker=threads_per_worker,
                memory_limit=memory_limit,
                processes=True,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            source = synthetic_seismic(shape, chunks="auto", dtype=dtype)

            def build(case=case, source=source):
                return source.memchunk.apply("gst3d", chunks=case.chunks)

            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                try:
                    plan = source.memchunk.plan("gst3d", chunks=case.chunks)
                except InfeasiblePlanError as exc:
                    refused = f"{type(exc).__name__}: {exc}"
                    runs.setdefault(case.label, []).append(
                        RunOutcome(case.label, False, refused[:200], 0.0, {}, 0, 0, 0)
                    )
                    continue
            outcome = run_watched(client, case.label, build)
            outcome.extra.update(
                chunks=plan.chunks,
                n_chunks=plan.n_chunks,
                predicted_peak=plan.predicted_peak_bytes,
                per_task_budget=plan.budget.per_task,
            )
            runs.setdefault(case.label, []).append(outcome)
    for case in cases:
        attempts = runs[case.label]
        failed = [o for o in attempts if not o.completed]
        if failed:
            outcomes.append(failed[0])
            continue
        ranked = sorted(attempts, key=lambda o: o.seconds)
        chosen = ranked[(len(ranked) - 1) // 2]
        chosen.extra["all_seconds"] = [round(o.seconds, 3) for o in attempts]
        outcomes.append(chosen)
    return outcomes


def format_table(outcomes: Sequence[RunOutcome], memory_limit: str | None = None) -> str:
    """A plain-text table of outcomes: one row per case."""
    header = (
        f"{'case':<14} {'chunks':<16} {'tasks':>6} {'outcome':<28} {'wall s':>7} "
        f"{'peak/worker':>12} {'pauses':>6} {'deaths':>6} {'predicted':>10}"
    )
    rows = [header, "-" * len(header)]
    for o in outcomes:
        chunks = "x".join(str(v) for v in o.extra.get("chunks", {}).values())
        outcome = "completed" if o.completed else (o.error.split(":")[0] or "failed")
        rows.append(
            f"{o.label:<14} {chunks:<16} {o.n_tasks:>6} {outcome:<28} {o.seconds:>7.2f} "
            f"{format_bytes(o.peak_bytes):>12} {o.pauses:>6} {o.worker_deaths:>6} "
            f"{format_bytes(o.extra.get('predicted_peak', 0)):>10}"
        )
    if memory_limit is not None:
        rows.append(
            f"worker memory_limit {memory_limit} ({format_bytes(to_bytes(memory_limit))}); "
            f"predicted = memchunk's model of one task's peak for those chunks"
        )
    return "\n".join(rows)


def plot_memory(outcomes: Sequence[RunOutcome], memory_limit: str, path: str) -> str:
    """Save a figure of each case's worker memory over time against the limit; return ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limit = to_bytes(memory_limit)
    fig, axes = plt.subplots(len(outcomes), 1, figsize=(8, 1.9 * len(outcomes)), sharex=True)
    axes = axes if len(outcomes) > 1 else [axes]
    for ax, o in zip(axes, outcomes, strict=True):
        for pid, samples in o.series.items():
            if samples:
                t, rss = zip(*samples, strict=True)
                ax.plot(t, [r / 1e9 for r in rss], lw=1, label=f"pid {pid}")
        ax.axhline(limit / 1e9, color="k", lw=1)
        ax.axhline(0.8 * limit / 1e9, color="orange", ls="--", lw=1)
        ax.axhline(0.95 * limit / 1e9, color="red", ls=":", lw=1)
        state = "ok" if o.completed else "FAILED"
        ax.set_title(f"{o.label}: {state}, {o.seconds:.1f} s", fontsize=9, loc="left")
        ax.set_ylabel("GB")
    axes[-1].set_xlabel("seconds; black: memory_limit, orange: pause (80%), red: kill (95%)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

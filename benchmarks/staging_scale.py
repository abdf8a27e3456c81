"""Staging a Dask graph's data on disk at the issue's scale: time, memory and the store's chunks.

Two medians over time whose in-memory rechunk cannot fit, so ``apply`` writes the data to a
temporary Zarr store in chunks chosen for the plan, then each task reads its block from it:

- ``a``: a (1200, 400, 400) float64 cube in 100-step chunks at ``memory_limit="1.5GB"``, and
  the same in memory at ``"3GB"``, for the time the staging costs;
- ``b``: a (3650, 4, 180, 360) float64 cube in one-step chunks at ``"1GiB"`` (7.6 GB written
  to the staging directory); no memory limit a 2-core machine has runs it in memory (every
  task would gather all 3650 source chunks).

Usage::

    python benchmarks/staging_scale.py                 # both cases, one run at a time
    python benchmarks/staging_scale.py --only a        # one of them
    python benchmarks/staging_scale.py --no-write      # print the table only

Each run gets a fresh ``LocalCluster`` (2 worker processes x 1 thread, on 127.0.0.1, the given
``memory_limit``), a fresh calibration directory (``MEMCHUNK_CALIBRATION_DIR``) and a fresh
staging directory, removed after the run. The wall time covers planning, staging and the
compute (``run_watched`` from :mod:`xarray_memchunk.testing`, which also samples the workers'
RSS and reads pauses and deaths from the scheduler). The table goes to
``benchmarks/results/staging_scale.md``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "staging_scale.md"


@dataclass(frozen=True)
class Case:
    """One run: the data, and the memory limit of each of the two workers.

    Attributes
    ----------
    label
        Row label.
    shape, chunks, dims
        The random cube and its source chunks.
    seed
        Seed of ``dask.array.random.default_rng``.
    memory_limit
        ``LocalCluster(memory_limit=...)``.
    """

    label: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dims: tuple[str, ...]
    seed: int
    memory_limit: str


CASES = {
    "a": [
        Case("a", (1200, 400, 400), (100, 400, 400), ("time", "y", "x"), 3, "1.5GB"),
        Case("a", (1200, 400, 400), (100, 400, 400), ("time", "y", "x"), 3, "3GB"),
    ],
    "b": [
        Case(
            "b",
            (3650, 4, 180, 360),
            (1, 4, 180, 360),
            ("time", "plev", "lat", "lon"),
            4,
            "1GiB",
        ),
    ],
}


@dataclass
class Row:
    """What one run measured (bytes and seconds)."""

    case: Case
    staged: bool = False
    chunks: dict[str, int] = field(default_factory=dict)
    n_chunks: int = 0
    per_task_budget: int = 0
    predicted_task: int = 0
    predicted_worker: int = 0
    write_task: str = ""
    store_chunks: tuple[int, ...] = ()
    staged_bytes: int = 0
    apply_seconds: float = 0.0
    seconds: float = 0.0
    peak_worker: int = 0
    idle_worker: int = 0
    pauses: int = 0
    deaths: int = 0
    error: str = ""
    load: tuple[float, float] = (0.0, 0.0)


def _cube(case: Case) -> Any:
    import dask.array as da
    import xarray as xr

    data = da.random.default_rng(case.seed).random(case.shape, chunks=case.chunks, dtype="float64")
    return xr.DataArray(data, dims=case.dims, name="t")


def _process_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(case: Case) -> Row:
    """Plan, stage and compute ``case``'s median over time on a fresh cluster, and measure."""
    import dask
    import zarr
    from distributed import Client, LocalCluster

    from xarray_memchunk.operators.staging import STAGING_DIR_KEY
    from xarray_memchunk.testing import run_watched

    for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    row = Row(case)
    load_before = os.getloadavg()[0]
    calibrations = Path(tempfile.mkdtemp(prefix="memchunk-calibrations-"))
    staging = Path(tempfile.mkdtemp(prefix="memchunk-staging-"))
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = str(calibrations)  # the workers inherit it
    data = _cube(case)
    try:
        with (
            dask.config.set({STAGING_DIR_KEY: str(staging)}),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                memory_limit=case.memory_limit,
                host="127.0.0.1",
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            client.run(lambda: __import__("xarray_memchunk"))
            time.sleep(0.5)  # a heartbeat reports the workers' memory after the import
            row.idle_worker = max(client.run(_process_rss).values(), default=0)
            plan = data.memchunk.plan("median", dim="time")
            row.staged = any("temporary Zarr store" in n for n in plan.notes)
            row.chunks = dict(plan.chunks)
            row.n_chunks = plan.n_chunks
            row.per_task_budget = plan.budget.per_task
            row.predicted_task = plan.predicted_peak_bytes
            row.predicted_worker = plan.budget.worker_baseline + plan.predicted_peak_bytes
            held = [re.search(r"each write task holds up to ([^;]+);", n) for n in plan.notes]
            row.write_task = next((m.group(1) for m in held if m), "")

            def build() -> Any:
                start = time.perf_counter()
                lazy = plan.apply()  # the plan above, not planned again: stages the data now
                row.apply_seconds = time.perf_counter() - start
                return lazy.data  # the median is small: computed whole

            outcome = run_watched(client, case.label, build)
        row.seconds = outcome.seconds
        row.peak_worker = outcome.peak_bytes
        row.pauses, row.deaths = outcome.pauses, outcome.worker_deaths
        row.error = outcome.error
        row.load = (load_before, os.getloadavg()[0])
        stores = list(staging.glob("memchunk-staged-*.zarr"))
        if stores:
            row.store_chunks = tuple(zarr.open_group(stores[0], mode="r")["t"].chunks)
            row.staged_bytes = _tree_bytes(stores[0])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(calibrations, ignore_errors=True)
    return row


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (MB = 10^6 bytes)."""
    header = (
        "| case | shape (source chunks) | memory_limit | staged | planned chunks | tasks | "
        "per-task budget MB | predicted peak per task MB | predicted worker MB | "
        "predicted write task | store chunks | staged MB | plan + stage s | total wall s | "
        "measured worker peak MB | "
        "idle worker MB | pauses | deaths | load avg before / after | outcome |"
    )
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in rows:
        c = r.case
        shape = f"{'x'.join(map(str, c.shape))} ({'x'.join(map(str, c.chunks))})"
        chunks = "x".join(str(r.chunks[d]) for d in c.dims) if r.chunks else ""
        store = "x".join(map(str, r.store_chunks)) if r.store_chunks else "-"
        lines.append(
            f"| {c.label} | {shape} | {c.memory_limit} | {'yes' if r.staged else 'no'} | "
            f"{chunks} | {r.n_chunks} | {_mb(r.per_task_budget)} | {_mb(r.predicted_task)} | "
            f"{_mb(r.predicted_worker)} | {r.write_task or '-'} | {store} | "
            f"{_mb(r.staged_bytes)} | "
            f"{r.apply_seconds:.1f} | {r.seconds:.1f} | {_mb(r.peak_worker)} | "
            f"{_mb(r.idle_worker)} | {r.pauses} | {r.deaths} | "
            f"{r.load[0]:.1f} / {r.load[1]:.1f} | "
            f"{'completed' if not r.error else r.error} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the cases one at a time, print the table and write it to :data:`RESULTS`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="cases to run")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    rows = []
    for key in args.only or sorted(CASES):
        for case in CASES[key]:
            print(f"running {case.label} at {case.memory_limit} ...", file=sys.stderr, flush=True)
            rows.append(run(case))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if not args.no_write:
        command = " ".join(["python", "benchmarks/staging_scale.py", *(argv or sys.argv[1:])])
        stamp = datetime.date.today().isoformat()
        RESULTS.write_text(
            f"Measured {stamp} on {platform.node()} ({platform.machine()}, Python "
            f"{platform.python_version()}, {os.cpu_count()} cores) with `{command}`: each run on "
            f"a fresh LocalCluster of 2 worker processes x 1 thread. MB = 10^6 bytes; "
            f"predicted worker = the plan's worker baseline + its predicted peak per task; "
            f"predicted write task = what the plan's note says a staging write task holds; "
            f"plan + stage s = `apply` (planning, and writing the store); total wall s = that "
            f"and the compute; load avg = the machine's 1-minute load average (2 cores, shared) "
            f"before and after the run.\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

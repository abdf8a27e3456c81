"""A user's function calibrated where its libraries were loaded, then run on fresh workers.

    python benchmarks/first_run_safety.py                  # 350 MB, 2 workers x 2 threads
    python benchmarks/first_run_safety.py --threads 1 --limit 300MB

A new user's trial: a groupby anomaly (flox, which imports numba, about 90 MiB a worker keeps)
was calibrated in a worker that had run a flox groupby before, so its calibration saw a rise of
7-10 MiB; its first run on fresh workers paused them 22-26 times. Here, on 4 yearly netCDF
files (1460 x 180 x 360 float32, one time step a storage chunk, opened with
``open_mfdataset``), in a calibration directory of its own:

1. a first cluster (2 workers, 1.5 GB) runs a flox groupby mean, then plans the function
   (which calibrates it there);
2. a fresh cluster at ``--limit`` plans it; where refused, the stated minimum is read;
3. fresh clusters at that minimum (rounded up to 0.01 MiB), ``--repeats`` times, plan it and
   write its result with ``memchunk.to_zarr``, watched; where a run taught more (its tasks
   measured above their prediction) and the next plan is refused, the next cluster is at the
   minimum that refusal states.

Prints a Markdown table: each cluster's limit, the plan's outcome, its worker baseline and
where that came from, the task peak predicted and measured (``plan.report()``), the run's
pauses, worker deaths and largest worker memory.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr
from harness.fresh import fresh_client

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate
from xarray_memchunk.testing import watch

MiB = 2**20


@xm.operator(whole=["time"])
def monthly_anomaly(tas: xr.DataArray) -> xr.DataArray:
    """Each value less its calendar month's mean (flox groups it)."""
    return tas.groupby("time.month") - tas.groupby("time.month").mean()


def make_files(directory: Path) -> str:
    """Four yearly netCDF files of the cube; their glob pattern."""
    data = synthetic_climate(1460, 180, 360, chunks={"time": 365}).compute()
    for year in range(4):
        piece = data[["tas"]].isel(time=slice(365 * year, 365 * (year + 1)))
        piece.to_netcdf(
            directory / f"clim_{year}.nc", encoding={"tas": {"chunksizes": (1, 180, 360)}}
        )
    return str(directory / "clim_*.nc")


def _open(pattern: str) -> xr.DataArray:
    return xr.open_mfdataset(
        pattern, chunks={}, data_vars="minimal", coords="minimal", compat="override"
    )["tas"]


def _baseline(plan) -> str:
    line = next(x for x in plan.explain().splitlines() if x.startswith("budget"))
    found = re.search(r"- ([\d,.]+ MiB) worker baseline \((.*?)\)\) x", line)
    return f"{found.group(1)} ({found.group(2)})" if found else line


def run_at(pattern: str, limit: str, threads: int, out: Path) -> dict:
    """Plan and write the function on a fresh cluster at ``limit``; what happened."""
    with fresh_client(2, threads, limit) as client:
        tas = _open(pattern)
        try:
            plan = tas.memchunk.plan(monthly_anomaly)
        except xm.InfeasiblePlanError as refused:
            return {"limit": limit, "outcome": "refused", "minimum": refused.minimum_memory_limit}
        shutil.rmtree(out, ignore_errors=True)
        outcome = watch(client, "anomaly", lambda: plan.apply().memchunk.to_zarr(out))
        report = plan.report()
    return {
        "limit": limit,
        "outcome": "completed" if outcome.completed else outcome.error,
        "baseline": _baseline(plan),
        "pauses": outcome.pauses,
        "deaths": outcome.worker_deaths,
        "peak": outcome.peak_bytes / MiB,
        "tasks": f"{report.predicted_task_bytes / MiB:.2f} / "
        f"{(report.measured_task_bytes or 0) / MiB:.2f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="350MB", help="the first fresh cluster's workers")
    parser.add_argument("--threads", type=int, default=2, help="threads per worker")
    parser.add_argument("--repeats", type=int, default=3, help="clusters at the stated minimum")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memchunk-first-run-") as tmp:
        root = Path(tmp)
        os.environ["MEMCHUNK_CALIBRATION_DIR"] = str(root / "calibrations")
        pattern = make_files(root)
        with fresh_client(2, args.threads, "1.5GB"):
            tas = _open(pattern)
            tas.groupby("time.month").mean().compute()  # the workers hold flox and numba
            calibrated = tas.memchunk.plan(monthly_anomaly)
        rows = [{"limit": "1.5GB (calibrated here)", "outcome": "planned"}]
        rows[0]["baseline"] = _baseline(calibrated)
        rows.append(run_at(pattern, args.limit, args.threads, root / "out.zarr"))
        minimum = rows[-1].get("minimum")
        for _ in range(args.repeats if minimum else 0):
            limit = f"{math.ceil(minimum / MiB * 100) / 100:.2f}MiB"
            rows.append(run_at(pattern, limit, args.threads, root / "out.zarr"))
            minimum = rows[-1].get("minimum", minimum)  # a run taught more: its new minimum
    print(f"2 workers x {args.threads} threads; `monthly_anomaly` calibrated after a flox groupby")
    print()
    print(
        "| memory_limit | outcome | worker baseline (why) | task MiB predicted / measured "
        "| pauses | deaths | peak MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        outcome = row["outcome"]
        if "minimum" in row:
            outcome += f", at least {row['minimum'] / MiB:.2f} MiB"
        peak = row.get("peak", np.nan)
        print(
            f"| {row['limit']} | {outcome} | {row.get('baseline', '')} | {row.get('tasks', '')} "
            f"| {row.get('pauses', '')} "
            f"| {row.get('deaths', '')} | {'' if np.isnan(peak) else f'{peak:.0f}'} |"
        )


if __name__ == "__main__":
    main()

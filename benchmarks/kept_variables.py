"""What xarray's tasks on a Dataset's kept, unplanned variables hold: predicted against measured.

    python benchmarks/kept_variables.py            # ~15 s

A groupby or resample broadcasts a variable without time along its groups or bins, and
``std`` over time computes float64 moments of it (:mod:`xarray_memchunk.operators.kept_variables`).
For each case a Dataset of ``tas(time, lat, lon)`` and a static ``deptho(lev, lat, lon)`` in
one chunk is planned on a LocalCluster of 1 worker x 1 thread (4 GB, so that nothing is cut),
applied, and only ``deptho`` of the result is written to Zarr. The worker's task records
(:class:`~xarray_memchunk.measure.task_peaks.TaskPeaks`) give the largest task's peak above
its start; the plan's note gives what it predicted for that task.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import xarray as xr
from distributed import Client, LocalCluster

import xarray_memchunk as xm  # noqa: F401  (the accessor)
from xarray_memchunk.measure.runs import _worker_records

CASES = {
    "resample MS mean": ("resample", {"freq": "MS", "reduction": "mean"}),
    "groupby month mean": ("groupby", {"by": "time.month", "reduction": "mean"}),
    "std over time": ("std", {"dim": "time"}),
    "mean over time": ("mean", {"dim": "time"}),
}


def dataset(levels: int) -> xr.Dataset:
    """tas over two years of days, and deptho with ``levels`` levels, in one chunk."""
    rng = np.random.default_rng(0)
    time_ = pd.date_range("2000-01-01", periods=730, freq="D")
    tas = rng.random((730, 90, 180), dtype="f4")
    deptho = rng.random((levels, 90, 180), dtype="f4")
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), tas), "deptho": (("lev", "lat", "lon"), deptho)},
        coords={"time": time_},
    )
    return ds.chunk({"time": 73, "lev": -1})


def measure(client: Client, case: str, levels: int, store: str) -> str:
    """One table row: the kept variable's largest task, predicted and measured."""
    op, kwargs = CASES[case]
    ds = dataset(levels)
    plan = ds.memchunk.plan(op, **kwargs)
    kept = plan._prepared.kept["deptho"]
    result = plan.apply()
    start = time.time()
    result[["deptho"]].to_zarr(store, mode="w")
    records = [r for rs in client.run(_worker_records, start).values() for r in rs]
    chunk = ds.deptho.nbytes
    out = max(np.prod([max(c) for c in result.deptho.chunks]) * 4, 1)
    peak = max(r.peak_bytes for r in records)
    mib = 2**20
    return (
        f"| {case} | {levels} | {chunk / mib:.1f} | {out / mib:.1f} | "
        f"{kept.task_bytes / mib:.1f} | {peak / mib:.1f} | {peak / kept.task_bytes:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="*", default=[10, 40])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = [
        "| case | levels | input chunk MiB | result chunk MiB | predicted task MiB | "
        "measured task MiB | measured / predicted |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="4GB",
            processes=True,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for levels in args.levels:
            for case in CASES:
                rows.append(measure(client, case, levels, f"{tmp}/out.zarr"))
    print("\n".join(rows))


if __name__ == "__main__":
    main()

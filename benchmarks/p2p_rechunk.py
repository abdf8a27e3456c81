"""distributed's P2P rechunk against memchunk's plan, on the issue's time-chunked graph.

A median over time of a (1200, 400, 400) float64 random cube made in 100-step chunks (a Dask
graph: 128 MB per source chunk). Time must be whole for the median, so the data is rechunked:

- ``p2p``: what a user writes with distributed's disk-backed P2P rechunk,
  ``x.chunk({"time": -1, "y": 20, "x": 100})`` under ``array.rechunk.method: p2p``, then
  ``.median("time")``; run with P2P's default comm buffer (``distributed.p2p.comm.buffer``,
  1 GiB) and with 64 MiB, set before the cluster starts (the workers inherit the config);
- ``memchunk``: ``apply("median", dim="time")``, which plans the rechunk itself (in memory, or
  staged through a temporary Zarr store).

Usage::

    python benchmarks/p2p_rechunk.py             # 1 GB and 1.5 GB workers, every way

Each run gets a fresh ``LocalCluster`` (2 worker processes x 1 thread, 127.0.0.1), a fresh
calibration and staging directory; pauses and deaths are read from the scheduler and the
workers' RSS sampled (:func:`xarray_memchunk.testing.run_watched`). Prints a Markdown table.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SHAPE, CHUNKS, SEED = (1200, 400, 400), (100, 400, 400), 3
#: (label, memory_limit, P2P comm buffer or None for memchunk)
CASES = [
    ("p2p, 1 GiB buffer", "1GB", "1GiB"),
    ("p2p, 64 MiB buffer", "1GB", "64MiB"),
    ("memchunk", "1GB", None),
    ("p2p, 1 GiB buffer", "1.5GB", "1GiB"),
    ("p2p, 64 MiB buffer", "1.5GB", "64MiB"),
    ("memchunk", "1.5GB", None),
]


def _build(buffer: str | None) -> Any:
    import dask
    import dask.array as da
    import xarray as xr

    data = da.random.default_rng(SEED).random(SHAPE, chunks=CHUNKS, dtype="float64")
    cube = xr.DataArray(data, dims=("time", "y", "x"), name="t")
    if buffer is None:
        return cube.memchunk.apply("median", dim="time").data
    with dask.config.set({"array.rechunk.method": "p2p"}):
        return cube.chunk({"time": -1, "y": 20, "x": 100}).median("time").data


def run(label: str, memory_limit: str, buffer: str | None) -> str:
    """One case on a fresh cluster; its table row."""
    import dask
    from distributed import Client, LocalCluster

    from xarray_memchunk.operators.staging import STAGING_DIR_KEY
    from xarray_memchunk.testing import run_watched

    for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    scratch = Path(tempfile.mkdtemp(prefix="memchunk-p2p-"))
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = str(scratch / "calibrations")
    config = {STAGING_DIR_KEY: str(scratch), "temporary-directory": str(scratch)}
    if buffer is not None:
        config["distributed.p2p.comm.buffer"] = buffer
    try:
        with (
            dask.config.set(config),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                memory_limit=memory_limit,
                host="127.0.0.1",
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            outcome = run_watched(client, label, lambda: _build(buffer))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    error = outcome.error.split(":")[0] if outcome.error else "completed"
    return (
        f"| {label} | {memory_limit} | {outcome.peak_bytes / 1e6:,.0f} | {outcome.pauses} | "
        f"{outcome.worker_deaths} | {outcome.seconds:.1f} | {error} |"
    )


def main() -> int:
    """Run every case, one at a time, and print the table."""
    rows = [
        "| way | memory_limit | worker peak MB | pauses | deaths | wall s | outcome |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in CASES:
        print(f"running {case[0]} at {case[1]} ...", file=sys.stderr, flush=True)
        rows.append(run(*case))
        print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a staged reduction's time goes: planning, staging the store, and the tasks after it.

    python benchmarks/staged_phases.py                      # median, memory and /tmp, 2 repeats
    python benchmarks/staged_phases.py --op quantile --repeats 3 --scale 0.5

On the climate cube of ``benchmarks/floors.py`` (2920 x 288 x 720 float32, one-day Zarr
chunks, written once to a temporary directory), on a fresh ``LocalCluster`` of 2 workers x 1
thread x 1 GB per run whose workers import the libraries first. Each repeat runs the staging
directory memchunk chooses itself (``/dev/shm`` where the data fit beyond the workers' limits)
and a disk directory (``memchunk.staging-dir`` set to ``--disk``), alternating which goes
first. Prints a Markdown table of each run's phases: ``plan``, ``stage`` (the write, inside
``apply``) and ``compute``, and the task time (summed over workers) of the write tasks and the
reduction tasks.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import dask
import xarray as xr
from distributed import get_task_stream
from floors import _import_libraries
from harness.fresh import fresh_client
from peers import make_cube

import xarray_memchunk
from xarray_memchunk.operators import staging


def _task_seconds(stream: list[dict]) -> dict[str, float]:
    """Compute seconds per task prefix: ``store`` (write tasks) and the rest."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for task in stream:
        key = task["key"][0] if isinstance(task["key"], tuple) else task["key"]
        kind = "write" if key.startswith("store") else "reduce"
        seconds[kind] += sum(
            s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute"
        )
    return seconds


def run(cube: Path, op: str, directory: str | None) -> dict:
    """One staged reduction on a fresh cluster; its phases in seconds."""
    stage, staged_in = staging.stage, {}

    def timed_stage(da, site, chunks=None):
        start = time.perf_counter()
        result = stage(da, site, chunks)
        staged_in["seconds"], staged_in["where"] = time.perf_counter() - start, site.where
        return result

    config = {staging.STAGING_DIR_KEY: directory} if directory else {}
    with fresh_client(2, 1, "1GB") as client, dask.config.set(config):
        client.run(_import_libraries)
        xarray_memchunk.api.stage = timed_stage
        try:
            tas = xr.open_zarr(cube)["tas"]
            kwargs = {"q": 0.9} if op == "quantile" else {}
            with get_task_stream() as stream:
                start = time.perf_counter()
                plan = tas.memchunk.plan(op, dim="time", **kwargs)
                planned = time.perf_counter()
                result = plan.apply()
                applied = time.perf_counter()
                result.compute()
                done = time.perf_counter()
        finally:
            xarray_memchunk.api.stage = stage
    xarray_memchunk.remove_staged_stores()
    tasks = _task_seconds(stream.data)
    return {
        "where": staged_in.get("where", "not staged"),
        "plan": planned - start,
        "stage": staged_in.get("seconds", 0.0),
        "compute": done - applied,
        "total": done - start,
        "write tasks": tasks["write"],
        "reduce tasks": tasks["reduce"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("median", "quantile"), default="median")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="the cube's days x scale")
    parser.add_argument("--disk", default=tempfile.gettempdir(), help="the disk directory")
    parser.add_argument("--cube", type=Path, help="a cube written before (peers.make_cube)")
    args = parser.parse_args()
    columns = ("plan", "stage", "compute", "total", "write tasks", "reduce tasks")
    print(f"| {args.op} staged in | " + " | ".join(f"{c} s" for c in columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    with tempfile.TemporaryDirectory(prefix="memchunk-phases-") as tmp:
        cube = args.cube or make_cube(Path(tmp), args.scale)
        for repeat in range(args.repeats):
            order = [None, args.disk] if repeat % 2 == 0 else [args.disk, None]
            for directory in order:
                row = run(cube, args.op, directory)
                cells = " | ".join(f"{row[c]:.2f}" for c in columns)
                print(f"| {row['where']} | {cells} |", flush=True)


if __name__ == "__main__":
    main()

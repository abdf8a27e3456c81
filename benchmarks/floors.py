"""Each workload against its floor: what the machine allows, measured in the same run.

    python benchmarks/floors.py                         # median, quantile, mean; median of 3
    python benchmarks/floors.py --only median --repeats 1 --scale 0.25

The floor of a reduction over time of the climate cube (Zarr, one-day zstd chunks, as in
``peers.py``) is reading the store once with 2 threads (``xarray.open_zarr(...).load()`` on
Dask's threaded scheduler) plus the reduction of the array in memory on the same 2 threads
(over longitude slabs). Against it, on a fresh ``LocalCluster`` of 2 workers x 1 thread x
``--memory-limit`` each run:

- ``memchunk``: ``tas.memchunk.apply(op, dim="time")``, as it plans (where its chunks would
  read each storage chunk many times over, it stages the store first:
  :mod:`xarray_memchunk.operators.read_once`);
- ``memchunk in memory``: the same, never staging to spare re-reads (what the plan did before),
  and ``memchunk staged``: always staging where a plan re-reads (the two sides of the choice);
- ``dask``: the call a Dask user writes on the store's auto chunks (time whole for the median
  and quantile, as xarray asks) — the best peer in ``peers.md`` for these rows; Cubed's rows
  are there.

Runs alternate the order of the tools on each repeat; the median-time run is kept. Prints a
Markdown table and writes it to ``benchmarks/results/floors.md``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dask
import dask.array
import numpy as np
import xarray as xr
from harness.fresh import fresh_client
from harness.timeouts import within
from peers import make_cube

import xarray_memchunk  # noqa: F401  (the .memchunk accessor)
from xarray_memchunk.operators import read_once
from xarray_memchunk.testing import watch

ROWS = ("median", "quantile", "mean")
TOOLS = ("memchunk", "memchunk in memory", "memchunk staged", "dask")
#: The staging decision forced, for the tools that force it: (STAGING_GAIN, MIN_REREAD_SECONDS).
FORCED = {"memchunk in memory": (math.inf, math.inf), "memchunk staged": (0.0, 0.0)}


def _reduce(op: str, data: xr.DataArray) -> xr.DataArray:
    if op == "quantile":
        return data.quantile(0.9, dim="time")
    return getattr(data, op)("time")


def floor_seconds(op: str, cube: Path) -> tuple[float, float]:
    """Seconds to read the store once and to reduce it in memory, both on 2 threads.

    Each the faster of two ways: the read with xarray (Dask's threads, one task per storage
    chunk) or with zarr alone (its own concurrent reads of the whole array); the reduction with
    xarray over longitude slabs or with memchunk's operator, both on Dask's threads.
    """
    import zarr

    with dask.config.set(scheduler="threads", num_workers=2):
        start = time.perf_counter()
        tas = xr.open_zarr(cube)["tas"].load()
        by_xarray = time.perf_counter() - start
        start = time.perf_counter()
        zarr.open_group(cube, mode="r")["tas"][...]
        by_zarr = time.perf_counter() - start
        slabs = tas.chunk({"time": -1, "lat": -1, "lon": math.ceil(tas.sizes["lon"] / 8)})
        start = time.perf_counter()
        _reduce(op, slabs).compute()
        xarray_compute = time.perf_counter() - start
        kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
        start = time.perf_counter()
        tas.memchunk.apply(op, **kwargs).compute()
        memchunk_compute = time.perf_counter() - start
    return min(by_xarray, by_zarr), min(xarray_compute, memchunk_compute)


def run_tool(op: str, tool: str, cube: Path, limit: str, timeout: float) -> dict:
    """One run of ``tool`` on fresh workers: its outcome, seconds, peak and chunks."""
    found: dict = {"tool": tool}

    def work() -> None:
        tas = xr.open_zarr(cube)["tas"]
        if tool == "dask":
            data = tas.chunk({"time": -1, "lat": "auto", "lon": "auto"}) if op != "mean" else tas
            found["total"] = float(np.nansum(_reduce(op, data).values, dtype="float64"))
            found["chunks"] = " x ".join(str(max(c)) for c in data.chunks)
            return
        kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
        kept = read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS
        read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS = FORCED.get(tool, kept)
        try:
            plan = tas.memchunk.plan(op, **kwargs)
            found["total"] = float(np.nansum(plan.apply().values, dtype="float64"))
        finally:
            read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS = kept
        found["chunks"] = " x ".join(str(n) for n in plan.chunks.values())
        found["staged"] = any("temporary Zarr store" in note for note in plan.notes)

    with fresh_client(2, 1, limit) as client:
        outcome = watch(client, tool, lambda: within(timeout, work))
    found |= {
        "completed": outcome.completed,
        "error": outcome.error,
        "seconds": outcome.seconds,
        "peak": outcome.peak_bytes,
        "pauses": outcome.pauses,
        "deaths": outcome.worker_deaths,
    }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="1GB", help="per worker (process)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=ROWS, help="rows to run")
    parser.add_argument("--scale", type=float, default=1.0, help="the cube's days, x 2,920")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "floors.md"))
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    lines = [
        "| work | route | chunks | outcome | wall s | / floor | peak per worker MB | pauses "
        "| deaths |",
        "| " + " | ".join(["---"] * 9) + " |",
    ]
    every: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="memchunk-floors-") as tmp:
        cube = make_cube(Path(tmp), args.scale)
        nbytes = xr.open_zarr(cube)["tas"].nbytes
        for op in rows:
            floors = [floor_seconds(op, cube) for _ in range(args.repeats)]
            read = statistics.median(f[0] for f in floors)
            compute = statistics.median(f[1] for f in floors)
            floor = read + compute
            runs: dict[str, list[dict]] = {t: [] for t in TOOLS}
            for repeat in range(args.repeats):
                for i in range(len(TOOLS)):
                    tool = TOOLS[(i + repeat) % len(TOOLS)]
                    found = run_tool(op, tool, cube, args.memory_limit, args.timeout)
                    runs[tool].append(found)
                    print(f"[{repeat + 1}] {op} {tool}: {found}", flush=True)
            lines.append(
                f"| {op} | floor: read once {read:.1f} s + in memory {compute:.1f} s | | | "
                f"{floor:.1f} | 1.00 | | | |"
            )
            for tool, found in runs.items():
                every[f"{op} {tool}"] = [round(f["seconds"], 1) for f in found]
                failed = [f for f in found if not f["completed"]]
                ranked = sorted(found, key=lambda f: f["seconds"])
                kept = failed[0] if failed else ranked[(len(ranked) - 1) // 2]
                outcome = "completed" if kept["completed"] else kept["error"][:80]
                staged = " (staged)" if kept.get("staged") and tool == "memchunk" else ""
                lines.append(
                    f"| {op} | {tool}{staged} | {kept.get('chunks', '')} | {outcome} | "
                    f"{kept['seconds']:.1f} | {kept['seconds'] / floor:.2f} | "
                    f"{max(f['peak'] for f in found) / 1e6:.0f} | "
                    f"{sum(f['pauses'] for f in found)} | {sum(f['deaths'] for f in found)} |"
                )
    header = (
        f"Measured {datetime.date.today()} on {platform.node()} ({platform.machine()}, Python "
        f"{platform.python_version()}) with `python {' '.join(sys.argv)}`: the cube "
        f"{nbytes / 1e9:.2f} GB float32 in one-day Zarr chunks; 2 workers x 1 thread x "
        f"{args.memory_limit}; median of {args.repeats} (pauses and deaths summed over runs, "
        f"peak the largest); dask {dask.__version__}, numpy {np.__version__}."
    )
    table = header + "\n\n" + "\n".join(lines)
    print(table)
    print("wall s of every run:", every)
    Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()

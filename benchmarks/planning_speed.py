"""Planning is on the interactive path: time ``plan()`` for 2-D to 5-D datasets.

    python benchmarks/planning_speed.py

Prints the median and worst time of ``obj.memchunk.plan(op)`` over repeated calls.
"""

from __future__ import annotations

import statistics
import time

import dask.array as da
import xarray as xr

import xarray_memchunk  # noqa: F401

CASES = [
    ("2-D field", {"y": 20_000, "x": 4_000}, {"y": 1_000, "x": 4_000}, "mean", {"dim": "y"}),
    (
        "3-D seismic",
        {"inline": 2_000, "crossline": 2_000, "sample": 1_500},
        {"inline": 128, "crossline": 128, "sample": 128},
        "gst3d",
        {},
    ),
    (
        "4-D climate, mean",
        {"time": 3_650, "level": 30, "lat": 721, "lon": 1_440},
        {"time": 10, "level": 30, "lat": 721, "lon": 1_440},
        "mean",
        {"dim": "time"},
    ),
    (
        "4-D climate, median",
        {"time": 3_650, "level": 30, "lat": 721, "lon": 1_440},
        {"time": 10, "level": 30, "lat": 721, "lon": 1_440},
        "median",
        {"dim": "time"},
    ),
    (
        "5-D ensemble",
        {"member": 50, "time": 1_000, "level": 20, "lat": 360, "lon": 720},
        {"member": 1, "time": 100, "level": 20, "lat": 360, "lon": 720},
        "std",
        {"dim": "member"},
    ),
]


def main(repeats: int = 20) -> None:
    print(f"{'case':<22} {'dims':>4} {'median ms':>10} {'max ms':>8}  chunks chosen")
    for label, sizes, chunks, op, kwargs in CASES:
        data = da.zeros(tuple(sizes.values()), chunks=tuple(chunks.values()), dtype="float32")
        obj = xr.DataArray(data, dims=tuple(sizes))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            plan = obj.memchunk.plan(op, memory_limit="4GB", **kwargs)
            times.append((time.perf_counter() - start) * 1e3)
        chosen = ", ".join(f"{d}={c}" for d, c in plan.chunks.items())
        median = statistics.median(times)
        print(f"{label:<22} {len(sizes):>4} {median:>10.1f} {max(times):>8.1f}  {chosen}")


if __name__ == "__main__":
    main()

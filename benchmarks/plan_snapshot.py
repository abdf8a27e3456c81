"""Print the plan of every benchmark case as JSON: chunks, predicted peak, binding.

    python benchmarks/plan_snapshot.py > before.json    # then refactor, and
    python benchmarks/plan_snapshot.py > after.json     # diff: a refactor changes no plan

Runs nothing: plans only, for fixed memory limits and a fixed cluster layout (2 workers x 1
thread), so that the output depends on the code alone. For the same reason the input's
production is not measured (``memchunk.measure-input: False``): one block of a random graph
measures a few kB differently each time.
"""

from __future__ import annotations

import json
import warnings

import dask
import dask.array as da
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic


def budget(limit: str) -> xm.Budget:
    from xarray_memchunk.memory_limits import make_budget
    from xarray_memchunk.units import to_bytes

    return make_budget(to_bytes(limit), 1, 2, "snapshot")


def cases():
    seismic = {n: synthetic_seismic((n,) * 3, chunks="auto") for n in (200, 300)}
    for n, volume in seismic.items():
        for limit in ("1.0GB", "1.5GB", "3.0GB"):
            yield f"gst3d {n}^3 {limit}", volume, "gst3d", limit, {}
    cube = xr.DataArray(
        da.random.default_rng(1).random((2100, 500, 600), chunks=(2100, 50, 300), dtype="f4"),
        dims=("time", "lat", "lon"),
    )
    for op in ("sum", "mean", "std", "var", "min", "max", "median", "quantile"):
        kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
        for limit in ("0.8GB", "1GB", "2GB"):
            yield f"{op} cube {limit}", cube, op, limit, kwargs
    climate = synthetic_climate(3650, 90, 180, chunks={"time": 1})
    for op in ("mean", "median"):
        yield f"{op} climate one-day chunks 1.5GB", climate, op, "1.5GB", {"dim": "T"}
    tall = xr.DataArray(
        da.random.default_rng(0).random((20000, 4000), chunks=(2000, 4000), dtype="f4"),
        dims=("time", "space"),
    )
    wide = xr.DataArray(
        da.random.default_rng(0).random((20000, 50000), chunks=(2000, 2000), dtype="f4"),
        dims=("time", "space"),
    )
    yield "svd tall exact 3GB", tall, "svd", "3GB", {"sample_dims": "time", "method": "exact"}
    yield "svd wide k=10 1.5GB", wide, "svd", "1.5GB", {"sample_dims": "time", "k": 10}


def main() -> None:
    out = {}
    for label, obj, op, limit, kwargs in cases():
        with warnings.catch_warnings(), dask.config.set({"memchunk.measure-input": False}):
            warnings.simplefilter("ignore")
            try:
                plan = xm.plan(obj, op, budget=budget(limit), **kwargs)
            except xm.InfeasiblePlanError as exc:
                out[label] = {"refused": str(exc).split(":")[0]}
                continue
        out[label] = {
            "chunks": {d: list(c) for d, c in plan.dask_chunks.items()},
            "predicted_peak_bytes": plan.predicted_peak_bytes,
            "binding": plan.binding,
        }
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()

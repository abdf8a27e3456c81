"""How long self-calibration takes: the seed's GST3D measuring itself, each run a fresh process.

    python benchmarks/self_calibration_time.py                     # this checkout, 3 runs each
    python benchmarks/self_calibration_time.py --code /tmp/before . --repeats 3

Each run is a new Python process (nothing imported, nothing calibrated: a fresh calibration
directory) that self-calibrates the seed's NumPy GST3D on a 200^3 float32 volume for a 1.5 GB
budget, as its first plan does, and prints the seconds, the blocks measured and the largest.
Two places the blocks run: a probe process started for them (no cluster), and a worker of a
fresh ``LocalCluster`` of 2 workers x 1 thread x 1.5 GB. The "first plan" rows time the whole
first ``plan()`` in each place: the calibration, and the measurement of the input's production
(the volume is made by a Dask graph), which runs while the measuring process starts. The
"next plan" rows time the seed's plan after a first plan of another function (a 5-point
smoothing) in the same process: the probe process is kept between calibrations, and a
cluster's worker has imported what the first needed. The "first plan, later process" row
times the first plan of a fresh Python whose calibration directory an earlier process
(untimed, a "first plan, probe process" run) filled: a calibration is saved and found again
by the function's code, dims and dtype, so a script run again plans without measuring.
``--code`` names checkouts of this repository to compare (each put first on
``PYTHONPATH``); their runs alternate, and the table gives each one's median. ``--places``
picks rows.

``--function anomaly`` plans an xarray expression instead, as a training day's user does: the
daily anomaly from a flox climatology (``groupby("time.dayofyear")``, time whole) of a
730 x 90 x 180 float32 temperature field made by a Dask graph in 30-day chunks. On the
cluster rows it plans for the cluster's own workers (no ``memory_limit``): each worker then
runs the function once while planning, which imports flox and numba. The "first plan, later
process, LocalCluster" row is the second run of such a script on a fresh cluster: its
calibration found again, the workers' first runs and the argument checks left.

    python benchmarks/self_calibration_time.py --function anomaly --places \
        "first plan, LocalCluster 2 x 1.5GB" "first plan, later process, LocalCluster 2 x 1.5GB"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = "LocalCluster 2 x 1.5GB"
LATER = "first plan, later process"
#: The environment variable naming the calibration directory a LATER run and its earlier
#: process share (each other run calibrates into a new one).
SHARED_DIR = "SELF_CALIBRATION_TIME_DIR"
PLACES = (
    "probe process",
    CLUSTER,
    "first plan, probe process",
    f"first plan, {CLUSTER}",
    "next plan, probe process",
    f"next plan, {CLUSTER}",
    LATER,
    f"{LATER}, {CLUSTER}",
)
FUNCTIONS = ("seed-gst3d", "anomaly")


def anomaly_from_climatology(tas):
    """The daily anomaly from the day-of-year climatology (flox's groupby)."""
    climatology = tas.groupby("time.dayofyear").mean()
    return tas.groupby("time.dayofyear") - climatology


def _smooth5(block):
    """A 5-point smoothing: the function planned first in the "next plan" rows."""
    from scipy import ndimage

    return ndimage.uniform_filter(block, 5)


def one(place: str, function: str) -> None:
    """Self-calibrate (or plan) once here and print what it took, as a JSON line."""
    shared = os.environ.get(SHARED_DIR)  # main() names it for LATER and its earlier process
    if place.startswith(LATER) and not shared:
        raise SystemExit(f"{LATER!r} plans in the calibration directory an earlier run filled")
    directory = shared or tempfile.mkdtemp(prefix="memchunk-selfcal-")
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = directory
    import dask
    import xarray as xr

    import xarray_memchunk
    from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic
    from xarray_memchunk.demo.seed_gst3d import seed_gst3d
    from xarray_memchunk.measure.self_calibration import self_calibrate
    from xarray_memchunk.memory_limits import resolve_budget
    from xarray_memchunk.models import load_calibration

    # a 1.5 GB budget for one task at a time, as on a worker of 1 thread: with no cluster, a
    # memory_limit is shared by the threaded scheduler's threads (num_workers)
    dask.config.set({"num_workers": 1})
    if function == "anomaly":
        data = xr.decode_cf(synthetic_climate(730, 90, 180, chunks={"time": 30})).tas
        op = xarray_memchunk.operator(whole=["time"], xarray=True)(anomaly_from_climatology)
        # the cluster's own workers, as a user plans there
        limit = None if place.endswith(CLUSTER) else "1.5GB"
    else:
        data = synthetic_seismic((200, 200, 200), chunks="auto").amplitude
        op, limit = seed_gst3d, "1.5GB"
    smooth5 = xarray_memchunk.operator(depth=dict.fromkeys(data.dims, 2))(_smooth5)
    kwargs = op.check_arguments({}, data)
    per_task = resolve_budget("1.5GB").per_task

    def measure() -> float:
        if place.startswith("next plan"):  # another function first, untimed
            data.memchunk.plan(smooth5, memory_limit=limit)
        started = time.perf_counter()
        if place.startswith(("first plan", "next plan")):  # LATER included
            data.memchunk.plan(op, memory_limit=limit)
        else:
            self_calibrate(op, data, kwargs, per_task)
        return time.perf_counter() - started

    if place.endswith(CLUSTER):
        from distributed import Client, LocalCluster

        with (
            LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1.5GB") as cluster,
            Client(cluster),
        ):
            seconds = measure()
    else:
        seconds = measure()
    key = op.cost(data).calibration_key
    profiles = load_calibration(key, "cpu", "float32").profiles
    print(
        json.dumps(
            {
                "code": str(Path(xarray_memchunk.__file__).parent.parent),
                "seconds": seconds,
                "blocks": len(profiles),
                "largest": max(math.prod(p["extents"].values()) for p in profiles),
            }
        )
    )


def _run_one(place: str, function: str, code: str, env: dict[str, str]) -> dict:
    """Run :func:`one` in a fresh Python in checkout ``code``, whose probe processes import it."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one", place, "--function", function],
        cwd=Path(code).resolve(),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", nargs="+", default=["."], help="checkouts to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--places", nargs="+", choices=PLACES, default=PLACES)
    parser.add_argument("--function", choices=FUNCTIONS, default=FUNCTIONS[0])
    parser.add_argument("--one", choices=PLACES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.function)
        return
    runs: dict[tuple[str, str], list[dict]] = {}
    for place in args.places:
        for _ in range(args.repeats):
            for code in args.code:  # alternated
                env = {**os.environ, "PYTHONPATH": str(Path(code).resolve())}
                if place.startswith(LATER):  # an earlier process calibrates, untimed
                    env[SHARED_DIR] = tempfile.mkdtemp(prefix="memchunk-selfcal-")
                    earlier = f"first plan, {CLUSTER}" if place.endswith(CLUSTER) else PLACES[2]
                    _run_one(earlier, args.function, code, env)
                record = _run_one(place, args.function, code, env)
                runs.setdefault((place, code), []).append(record)
                print(f"{place:<50} {code}: {record['seconds']:.2f} s", flush=True)
    print("\n| where the blocks run | code | median s | runs s | blocks | largest block |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (place, code), records in runs.items():
        seconds = [r["seconds"] for r in records]
        print(
            f"| {place} | {code} | {statistics.median(seconds):.2f} | "
            f"{', '.join(f'{s:.2f}' for s in seconds)} | {records[-1]['blocks']} | "
            f"{records[-1]['largest']:,} |"
        )


if __name__ == "__main__":
    main()

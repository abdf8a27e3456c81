"""Every built-in operator, float32 and float64, input from a Dask graph, a Zarr store (and for
GST3D a SEG-Y file): does the memory-bound plan run with 0 pauses and 0 deaths?

    python benchmarks/plan_safety.py                    # the whole matrix (~30 min on 2 cores)
    python benchmarks/plan_safety.py --only std median  # some operators
    python benchmarks/plan_safety.py --issue            # issue 17's reproduction only
    python benchmarks/plan_safety.py --learning         # issue 27: user functions, a kill
    python benchmarks/plan_safety.py --as-users         # issue 28: sources and deployments
    python benchmarks/plan_safety.py --xarray           # issue 30: xarray expressions
    python benchmarks/plan_safety.py --near-minimum     # stencils just above their minimum
    python benchmarks/plan_safety.py --xarray --only rolling --out <file>
    python benchmarks/plan_safety.py --xarray --only resample groupby --out <file>

Each case runs on a fresh ``LocalCluster`` of 2 workers x 1 thread, with the largest memory
limit (of ``harness.plan_safety.LIMITS``) at which the plan's binding
constraint is memory. Shapes and chunkings are ones no calibration profiled. Prints a Markdown
table and writes it to ``benchmarks/results/plan_safety.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
from harness.plan_safety import (
    SafetyCase,
    format_table,
    most_tasks_near_minimum,
    run_case,
    summary,
)

import xarray_memchunk as xm

CUBE = {"time": 2100, "lat": 500, "lon": 600}
VOLUME = {"inline": 320, "crossline": 320, "sample": 320}
TALL = {"time": 40000, "y": 40, "x": 50}
WIDE = {"time": 8000, "y": 100, "x": 300}

REDUCTIONS = ["sum", "mean", "std", "var", "min", "max", "median", "quantile"]


def matrix(only: list[str] | None) -> list[SafetyCase]:
    cases = []
    for dtype in ("float32", "float64"):
        for op in REDUCTIONS:
            kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
            cases.append(
                SafetyCase(op, dtype, CUBE, {"time": 2100, "lat": 50, "lon": 300}, "graph", kwargs)
            )
            cases.append(
                SafetyCase(op, dtype, CUBE, {"time": 100, "lat": 250, "lon": 300}, "file", kwargs)
            )
        for kernel in ("gaussian", "d2geo"):
            kwargs = {"kernel": kernel}
            cases.append(
                SafetyCase("gst3d", dtype, VOLUME, dict.fromkeys(VOLUME, 160), "graph", kwargs)
            )
            cases.append(
                SafetyCase("gst3d", dtype, VOLUME, dict.fromkeys(VOLUME, 64), "file", kwargs)
            )
        seismic = dict.fromkeys(VOLUME, 64)
        cases.append(SafetyCase("gst3d", dtype, VOLUME, seismic, "segy", {"kernel": "gaussian"}))
        exact = {"sample_dims": "time", "method": "exact"}
        two_pass = exact | {"tsqr": "two-pass"}
        for source, kwargs, label in (
            ("graph", exact, ""),
            ("graph", two_pass, "svd-two-pass"),
            ("file", two_pass, "svd-two-pass"),
        ):
            tall_chunks = {"time": 5000, "y": 40, "x": 50}
            cases.append(SafetyCase("svd", dtype, TALL, tall_chunks, source, kwargs, label=label))
        cases.append(
            SafetyCase(
                "svd",
                dtype,
                WIDE,
                {"time": 1000, "y": 100, "x": 300},
                "file",
                {"sample_dims": "time", "method": "compressed", "k": 10},
            )
        )
    if only:
        cases = [c for c in cases if c.op in only or c.name in only]
    return cases


def issue_cases() -> list[SafetyCase]:
    """Issue 17: a float32 cube on 2 x 1 GB workers, time whole, two input chunkings."""
    return [
        SafetyCase(op, "float32", CUBE, chunks, "graph", {"dim": "time"}, "1GB", f"{op} (issue 17)")
        for chunks in ({"time": 2100, "lat": 50, "lon": 300}, {"time": 2100, "lat": 50, "lon": 600})
        for op in ("std", "median")
    ]


def stacked_copies(k: int):
    """A closure: ``k`` copies of its block at once (``k`` is not in its source)."""

    def stacked(block):
        return np.stack([block] * k).sum(0)

    return stacked


def gram(block):
    """Memory quadratic in the block's second dim: ``g = b.T @ b``; returns the block.

    ``nan_to_num``: a NaN in the block's first column would otherwise make every value NaN, a
    function of the whole block along that dim (the plan's halo check refuses it).
    """
    g = block.T @ block
    return block + np.nan_to_num(g[0, 0]) * 0


def learning_cases() -> list[SafetyCase]:
    """Issue 27: self-calibrating functions, and a worker killed (not by memory) mid-run.

    ``stacked-1`` runs before ``stacked-30``: the same source, another closure, so the second
    must measure itself again rather than reuse the first one's model.
    """
    for name, func in (
        ("stacked-1", stacked_copies(1)),
        ("stacked-30", stacked_copies(30)),
        ("gram", gram),
    ):
        xm.register_operator(xm.BlockwiseOperator(name, func), overwrite=True)
    square = {"y": 6000, "x": 6000}
    return [
        SafetyCase("stacked-1", "float64", square, {"y": 500, "x": 6000}, "graph"),
        SafetyCase("stacked-30", "float64", square, {"y": 500, "x": 6000}, "graph"),
        SafetyCase("gram", "float64", {"y": 10000, "x": 8000}, {"y": 250, "x": 8000}, "graph"),
        SafetyCase(
            "std",
            "float64",
            {"time": 800, "y": 200, "x": 500},
            {"time": 800, "y": 25, "x": 500},
            "graph",
            {"dim": "time"},
            label="std, a worker SIGKILLed",
            kill_after=2.0,
        ),
    ]


DAILY = {"time": 1460, "lat": 180, "lon": 360}


def as_users_cases() -> list[SafetyCase]:
    """Issue 28: data as users hold it, clusters as they run them.

    Sources: many netCDF files in one-day chunks (``open_mfdataset``), a graph with
    preprocessing upstream (time-chunked, and in one-step time chunks: the rechunk goes
    through disk where memory cannot hold it), Zarr in one-day chunks. Deployments: 2 and 4
    threads per worker, scheduler and workers as separate processes, an adaptive cluster, and
    an adaptive cluster whose workers run in this process (``processes=False``).
    """
    one_day = {"time": 1, "lat": 180, "lon": 360}
    by_lat = {"time": 1460, "lat": 45, "lon": 360}
    over_time = {"dim": "time"}
    cases = [
        SafetyCase("median", "float32", DAILY, one_day, "mfdataset", over_time),
        SafetyCase("median", "float64", DAILY, one_day, "mfdataset", over_time),
        SafetyCase(
            "median", "float32", DAILY, one_day, "file", over_time, label="median, Zarr 1-day"
        ),
        SafetyCase(
            "median",
            "float64",
            {"time": 1200, "lat": 200, "lon": 400},
            {"time": 100, "lat": 200, "lon": 400},
            "preprocessed",
            over_time,
        ),
        SafetyCase(
            "mean",
            "float32",
            {"time": 1262, "lat": 221, "lon": 313},
            {"time": 275, "lat": 221, "lon": 313},
            "preprocessed",
            over_time,
        ),
        SafetyCase("std", "float64", DAILY, one_day, "preprocessed", over_time),
    ]
    # workers in this process pause on all it holds (a CI run hung on one before any task):
    # at two limits each, named by it
    deployments = [(2, "local", None), (4, "local", None), (2, "processes", None)]
    deployments += [(1, "adaptive", None), (1, "in-process", "1GB"), (1, "in-process", "2GB")]
    cases += [
        SafetyCase(
            op,
            "float32",
            DAILY,
            by_lat,
            "graph",
            over_time,
            limit,
            f"{op}, in this process at {limit}" if limit else "",
            threads=threads,
            deployment=deployment,
        )
        for threads, deployment, limit in deployments
        for op in ("median", "std")
    ]
    return cases


def staged_cases() -> list[SafetyCase]:
    """Issue 28 item 2 at its scale: whole-dim operators on time-chunked graph data, through disk.

    Each is planned at the issue's memory limit, where no rechunk in memory fits, so the data is
    staged in a temporary Zarr store first.
    """
    over_time = {"dim": "time"}
    cube = {"time": 1200, "y": 400, "x": 400}
    thick = {"time": 100, "y": 400, "x": 400}
    four_d = {"time": 3650, "plev": 4, "lat": 180, "lon": 360}
    one_step = {"time": 1, "plev": 4, "lat": 180, "lon": 360}
    return [
        SafetyCase("median", "float64", cube, thick, "graph", over_time, "1.5GB", "median 3-D"),
        SafetyCase(
            "median",
            "float64",
            cube,
            thick,
            "graph",
            over_time,
            "1.2GB",
            "median 3-D, separate processes",
            deployment="processes",
        ),
        SafetyCase("median", "float64", four_d, one_step, "graph", over_time, "1GiB", "median 4-D"),
    ]


def xarray_cases() -> list[SafetyCase]:
    """Issue 30: climatologies, anomalies, resampling, rolling, weighting, a fit and a chain.

    Each a function of an xarray object (:mod:`harness.climate_functions`), measured on its
    first plan; 4 years of daily data in one-day chunks, from a Zarr store and from 4 netCDF
    files opened with ``open_mfdataset``; float32 and float64.
    """
    import harness.climate_functions as functions

    one_day = {"time": 1, "lat": 180, "lon": 360}
    pairs = [("float32", "file"), ("float64", "mfdataset")]  # each dtype from one source
    cases = [
        SafetyCase(name, dtype, DAILY, one_day, source, dates=True, label=f"{name} ({source})")
        for name in functions.FUNCTIONS
        for dtype, source in pairs
    ]
    window = {"dim": "time", "window": 30, "center": True}
    cases += [
        SafetyCase(
            "rolling",
            dtype,
            DAILY,
            one_day,
            source,
            window,
            dates=True,
            label=f"rolling built-in ({source})",
            reference=functions.FUNCTIONS["rolling-30"],
        )
        for dtype, source in pairs
    ]
    large = {"time": 1460, "lat": 300, "lon": 600}  # larger fields: memory binds the plan
    one_large_day = {"time": 1, "lat": 300, "lon": 600}
    cases += [  # whole months per chunk, read as stored: time is not whole
        SafetyCase(
            "resample",
            dtype,
            large,
            one_large_day,
            source,
            {"freq": "1MS", "reduction": reduction},
            dates=True,
            label=f"resample built-in, {reduction} ({source})",
            reference=lambda tas, reduction=reduction: getattr(
                tas.resample(time="1MS"), reduction
            )(),
        )
        for (dtype, source), reduction in zip(pairs, ("mean", "median"), strict=True)
    ]
    cases += [  # flox's method chosen with the chunks: map-reduce partials grow with groups
        SafetyCase(
            "groupby",
            dtype,
            large,
            one_large_day,
            source,
            {"by": by},
            dates=True,
            label=f"groupby built-in, {by} ({source})",
            reference=lambda tas, by=by: tas.groupby(by).mean(),
        )
        for (dtype, source), by in zip(pairs, ("time.month", "time.dayofyear"), strict=True)
    ]
    cases.append(  # a stencil over a graph's chunks: neighbours wait in the workers
        SafetyCase(
            "rolling",
            "float64",
            DAILY,
            {"time": 100, "lat": 180, "lon": 360},
            "preprocessed",
            window | {"center": False},
            dates=True,
            label="rolling built-in, trailing (preprocessed graph)",
            reference=lambda tas: tas.rolling(time=30).mean(),
        )
    )
    return cases


def near_minimum_cases() -> list[SafetyCase]:
    """Stencils on volumes made in one Dask chunk, just above the minimum their refusal states.

    Each runs on 1 worker x 2 threads at the limit (up to 6% over the minimum) planned in most
    tasks: where only the plans that need least fit, which were once a great many tiny chunks
    (10^3 of a 200^3 volume: its worker paused, and the run hung).
    """
    cases = []
    for op, dtype, n in (
        ("gst3d", "float32", 120),
        ("gst3d", "float32", 200),
        ("gst3d", "float64", 200),
        ("laplacian", "float32", 400),  # smaller volumes plan with the least memory given room
    ):
        volume = dict.fromkeys(VOLUME, n)
        cases.append(SafetyCase(op, dtype, volume, volume, "graph", threads=2, label=f"{op}-{n}"))
    return [
        dataclasses.replace(c, memory_limit=str(most_tasks_near_minimum(c, n_workers=1)))
        for c in cases
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="operator names (or labels) to run")
    parser.add_argument("--issue", action="store_true", help="issue 17's reproduction only")
    parser.add_argument("--no-issue", action="store_true", help="skip issue 17's reproduction")
    parser.add_argument("--learning", action="store_true", help="issue 27's learning cases only")
    parser.add_argument(
        "--as-users", action="store_true", help="issue 28's sources and deployments only"
    )
    parser.add_argument(
        "--staged", action="store_true", help="issue 28's staged cases at the issue's scale"
    )
    parser.add_argument("--xarray", action="store_true", help="issue 30's xarray expressions")
    parser.add_argument(
        "--near-minimum", action="store_true", help="stencils just above their stated minimum"
    )
    parser.add_argument("--out", help="the table's file (benchmarks/results/plan_safety*.md)")
    args = parser.parse_args()
    name = "plan_safety.md"
    if args.learning:
        name = "plan_safety_learning.md"
    elif args.as_users or args.staged:
        name = "plan_safety_staged.md" if args.staged else "plan_safety_as_users.md"
    elif args.xarray:
        name = "plan_safety_xarray.md"
    elif args.near_minimum:
        name = "plan_safety_near_minimum.md"
    args.out = args.out or str(Path(__file__).parent / "results" / name)
    if args.learning:
        cases = learning_cases()
    elif args.as_users:
        cases = [c for c in as_users_cases() if not args.only or {c.op, c.name} & set(args.only)]
    elif args.staged:
        cases = staged_cases()
    elif args.xarray:
        cases = [c for c in xarray_cases() if not args.only or c.op in args.only]
    elif args.near_minimum:
        cases = []  # planned below, with the run's own calibrations
    else:
        cases = ([] if args.no_issue else issue_cases()) + ([] if args.issue else matrix(args.only))
    results = []
    with tempfile.TemporaryDirectory() as root:
        # what the runs teach stays in this run: never in the user's own calibration directory
        os.environ.setdefault("MEMCHUNK_CALIBRATION_DIR", str(Path(root) / "calibrations"))
        if args.near_minimum:
            cases = near_minimum_cases()
        for i, case in enumerate(cases, 1):
            result = run_case(case, Path(root), n_workers=1 if args.near_minimum else 2)
            results.append(result)
            print(f"[{i}/{len(cases)}] " + format_table([result]).splitlines()[-1], flush=True)
    table = format_table(results)
    line = summary(results)
    print("\n" + table + "\n\n" + line)
    header = (
        f"Measured {datetime.date.today()} on {platform.node() or 'this machine'} "
        f"({platform.machine()}, Python {platform.python_version()}) with "
        f"`python {' '.join(sys.argv)}`: {1 if args.near_minimum else 2} worker(s) per case, "
        "1 thread each unless the input column says otherwise, a fresh cluster each."
    )
    Path(args.out).write_text(header + "\n\n" + table + "\n\n" + line + "\n")


if __name__ == "__main__":
    main()

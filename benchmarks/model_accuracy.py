"""How far are memory-model predictions from measurements, on shapes not used in fitting?

    python benchmarks/model_accuracy.py                 # every calibrated operator, both dtypes
    python benchmarks/model_accuracy.py --compare-bare  # also: worker method vs a bare process
    python benchmarks/model_accuracy.py --upstream      # input made by a graph upstream

With ``--upstream`` the input is ``(standard_normal(...) * 2 + 1).astype(dtype)``, produced in
the task's graph (issue 28): the prediction is the plan's, the larger of making the block
(measured as a plan measures it, ``xarray_memchunk.operators.production``) and the operator's
model plus what its fused task keeps of the input's graph.

For each operator and dtype, tasks of held-out shapes (one of them ~10x the largest fitted task)
run inside a Dask worker as the graph that ``apply`` builds runs them, measured as calibration
measures them (``xarray_memchunk.measure.calibrate.run_task``); the table gives the median absolute
error, the worst under-prediction and the worst over-prediction, in percent of the measured
peak.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys

import numpy as np
from distributed import Client, LocalCluster

from xarray_memchunk.measure.calibrate import features_of, run_task, task_cost
from xarray_memchunk.models.calibration import load_calibration
from xarray_memchunk.models.fitting import prediction_errors
from xarray_memchunk.models.profiling import profile_in_worker
from xarray_memchunk.operators import get_operator


def reduction_shapes(big: bool):
    shapes = [(90, 70, 110), (400, 150, 150), (1500, 64, 64), (25, 500, 500), (800, 200, 90)]
    if big:
        shapes.append((2500, 250, 250))  # 156 M elements: 10x the largest fitted (15.6 M)
    return [{"time": t, "y": y, "x": x} for t, y, x in shapes]


CASES = {
    # name: (operator, kwargs, shapes(big) -> list)
    "sum": ("sum", {"dim": "time"}, reduction_shapes),
    "mean": ("mean", {"dim": "time"}, reduction_shapes),
    "std": ("std", {"dim": "time"}, reduction_shapes),
    "var": ("var", {"dim": "time"}, reduction_shapes),
    "min": ("min", {"dim": "time"}, reduction_shapes),
    "max": ("max", {"dim": "time"}, reduction_shapes),
    "median": ("median", {"dim": "time"}, reduction_shapes),
    "quantile": ("quantile", {"dim": "time", "q": 0.9}, reduction_shapes),
    "gst3d": (
        "gst3d",
        {},
        lambda big: [
            {"inline": a, "crossline": b, "sample": c}
            for a, b, c in [(48, 48, 48), (90, 70, 110), (140, 100, 80), (120, 120, 120)]
            + ([(300, 300, 300)] if big else [])  # 27 M voxels: 10x the largest fitted (2.7 M)
        ],
    ),
    "gst3d-d2geo": (
        "gst3d",
        {"kernel": "d2geo"},
        lambda big: [
            {"inline": a, "crossline": b, "sample": c}
            for a, b, c in [(48, 48, 48), (90, 70, 110), (140, 100, 80), (120, 120, 120)]
            + ([(300, 300, 300)] if big else [])
        ],
    ),
    "svd": (
        "svd",
        {"sample_dims": ("time",), "method": "exact"},
        lambda big: [
            {"time": t, "space": s}
            for t, s in [(3000, 150), (6000, 500), (12000, 400), (2500, 900)]
            # 30 M elements, 3x the largest fitted (9.6 M): LAPACK's SVD of a 10x matrix takes
            # minutes per run on 2 cores
            + ([(30000, 1000)] if big else [])
        ],
    ),
    "svd-compressed": (
        "svd",
        {"sample_dims": ("time",), "method": "compressed", "k": 10},
        lambda big: [
            {"time": t, "space": s}
            for t, s in [(1500, 2500), (7000, 3000), (3000, 9000), (6000, 6000)]
            # 400 M elements (1.6 GB float32): 10x the largest fitted (40 M)
            + ([(20000, 20000)] if big else [])
        ],
    ),
}


def _with_production(task: float, extents, dtype, fuses: bool) -> float:
    """The plan's peak of a one-chunk task on the ``--upstream`` input.

    The larger of making the block (as a plan measures it) and running the operator (with what
    the fused task keeps of the input's graph), as the plan's footprint counts them.
    """
    import dask.array as da
    import xarray as xr

    from xarray_memchunk.operators.production import input_production
    from xarray_memchunk.planning.footprint import production_phases

    shape = tuple(extents.values())
    normal = da.random.default_rng(0).standard_normal(shape, chunks=shape)
    made = input_production(xr.DataArray((normal * 2.0 + 1.0).astype(dtype), dims=list(extents)))
    held = made.held_bytes if fuses else 0
    return task + float(production_phases(task, made.block_bytes, made.extra_bytes, held))


def measure(client, name, dtypes, big, repeats, upstream=False):
    op_name, kwargs, shapes = CASES[name]
    operator = get_operator(op_name)
    kwargs, _ = operator.calibration_setup(**kwargs)
    runner = functools.partial(run_task, upstream=upstream)
    rows = []
    for dtype in dtypes:
        cases = [(s, s, (operator, kwargs, s, s, dtype)) for s in shapes(big)]
        # a fresh worker's first task pays one-time costs (imports, buffers): run one, unkept,
        # as self-calibration does
        profile_in_worker(client, runner, cases[:1], dtype, 1)
        profiles = profile_in_worker(client, runner, cases, dtype, repeats)
        cost = task_cost(operator, shapes(big)[0], dtype, kwargs)[1]
        key = cost.calibration_key
        calibration = load_calibration(key, "cpu", dtype)
        model = calibration.model
        predicted, measured = [], []
        for p in profiles:
            feats = features_of(operator, p.extents, dtype, kwargs)
            task = float(model.peak_bytes({k: np.array([v]) for k, v in feats.items()})[0])
            if upstream:
                task = _with_production(task, p.extents, dtype, cost.fuses_with_input)
            predicted.append(task)
            measured.append(p.peak_bytes)
        errors = prediction_errors(np.array(predicted), np.array(measured))
        largest = int(np.argmax(measured))
        gap = max(0.0, float(np.max(np.array(measured) - np.array(predicted))))
        source = calibration.path.split("/")[-1]
        rows.append(
            (name, dtype, len(profiles), errors, source, measured[largest], predicted[largest], gap)
        )
    return rows


def _bare_max_rss(code: str) -> int:
    """Max RSS of a fresh Python running ``code``, as ``/usr/bin/time -v`` reports it."""
    import os

    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"bare process failed: {code}")
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def compare_bare(client) -> None:
    """GST3D 150^3 float32: the worker method vs a bare process's max RSS."""
    imports = "import numpy as np; from xarray_memchunk.operators.gst3d.kernels import gst3d_block"
    task = imports + (
        "; x = np.random.default_rng(0).standard_normal((150, 150, 150), dtype=np.float32)"
        "; gst3d_block(x)"
    )
    bare_task, bare_imports = _bare_max_rss(task), _bare_max_rss(imports)
    operator = get_operator("gst3d")
    shape = {"inline": 150, "crossline": 150, "sample": 150}
    kwargs = operator.check_arguments({})
    worker = profile_in_worker(
        client,
        run_task,
        [(shape, shape, (operator, kwargs, shape, shape, "float32"))],
        "float32",
        3,
    )
    rows = [
        ("bare process max RSS (ru_maxrss, /usr/bin/time -v)", bare_task),
        ("bare process max RSS, imports only", bare_imports),
        ("bare process: task alone (difference)", bare_task - bare_imports),
        (f"Dask worker: VmHWM - VmRSS before ({worker[0].method})", worker[0].peak_bytes),
    ]
    print("\nGST3D 150^3 float32 peak, measured three ways:")
    for label, value in rows:
        print(f"  {label:<52} {value / 1e6:8.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CASES))
    parser.add_argument("--dtype", nargs="*", default=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-big", action="store_true", help="skip the 10x extrapolation shape")
    parser.add_argument("--compare-bare", action="store_true")
    parser.add_argument("--upstream", action="store_true", help="input made by a graph upstream")
    args = parser.parse_args()
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit=0, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        print(
            f"{'operator':<12} {'dtype':<8} {'shapes':>6} {'median |err| %':>15} "
            f"{'worst under %':>14} {'(MB)':>6} {'worst over %':>13} {'largest: measured':>18} "
            f"{'predicted':>10}  model"
        )
        for name in args.only or CASES:
            rows = measure(client, name, args.dtype, not args.no_big, args.repeats, args.upstream)
            for row in rows:
                name_, dtype, n, e, source, m, p, gap = row
                print(
                    f"{name_:<12} {dtype:<8} {n:>6} {e['median_abs_pct_error']:>15.1f} "
                    f"{e['worst_under_pct']:>14.1f} {gap / 1e6:>6.1f} {e['worst_over_pct']:>13.1f} "
                    f"{m / 1e6:>15.1f} MB {p / 1e6:>7.1f} MB  {source}",
                    flush=True,
                )
        if args.compare_bare:
            compare_bare(client)


if __name__ == "__main__":
    main()

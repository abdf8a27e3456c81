"""GST3D: Dask auto chunks vs manual cubic chunks vs memchunk, on a real LocalCluster.

The seed notebook's experiment (``shared/seeds/memory-aware-chunking-notebook.txt``), runnable::

    python benchmarks/gst3d_experiment.py                          # 200^3, 2 x 1 thread x 1.5GB
    python benchmarks/gst3d_experiment.py --memory-limit 1.0GB
    python benchmarks/gst3d_experiment.py --size 300 --memory-limit 3.0GB

Prints a table and saves a plot of worker memory over time under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from xarray_memchunk.demo.experiment import (
    default_cases,
    format_table,
    plot_memory,
    run_gst3d_experiment,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200, help="edge of the cubic volume")
    parser.add_argument("--memory-limit", default="1.5GB", help="per-worker memory limit")
    parser.add_argument("--nworkers", type=int, default=2)
    parser.add_argument("--nthreads", type=int, default=1)
    parser.add_argument("--manual", type=int, nargs="*", default=[50, 64, 100, 128, 200])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case (median kept)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()

    shape = (args.size,) * 3
    manual = [n for n in args.manual if n <= args.size]
    outcomes = run_gst3d_experiment(
        shape,
        memory_limit=args.memory_limit,
        n_workers=args.nworkers,
        threads_per_worker=args.nthreads,
        cases=default_cases(manual),
        dtype=args.dtype,
        repeats=args.repeats,
    )
    print(
        f"GST3D on {shape} {args.dtype}, LocalCluster {args.nworkers} workers x "
        f"{args.nthreads} thread(s) x {args.memory_limit}, median of {args.repeats} run(s)"
    )
    print(format_table(outcomes, args.memory_limit))
    manual_ok = [o for o in outcomes if o.label.startswith("manual") and o.completed]
    memchunk = next(o for o in outcomes if o.label == "memchunk")
    if manual_ok and memchunk.completed:
        best = min(manual_ok, key=lambda o: o.seconds)
        ratio = memchunk.seconds / best.seconds
        print(f"memchunk / best manual ({best.label}) wall time: {ratio:.2f}")
    os.makedirs(args.out, exist_ok=True)
    stem = f"gst3d_{args.size}_{args.memory_limit}_{args.nworkers}x{args.nthreads}"
    print("plot:", plot_memory(outcomes, args.memory_limit, os.path.join(args.out, stem + ".png")))
    record = {
        "shape": shape,
        "memory_limit": args.memory_limit,
        "dtype": args.dtype,
        "workers": args.nworkers,
        "threads": args.nthreads,
        "date": time.strftime("%Y-%m-%d"),
        "cases": [
            {
                "label": o.label,
                "completed": o.completed,
                "error": o.error,
                "seconds": o.seconds,
                "peak_worker_bytes": o.peak_bytes,
                "pauses": o.pauses,
                "deaths": o.worker_deaths,
                "tasks": o.n_tasks,
                **{k: v for k, v in o.extra.items()},
            }
            for o in outcomes
        ],
    }
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(record, f, indent=1, default=str)


if __name__ == "__main__":
    main()

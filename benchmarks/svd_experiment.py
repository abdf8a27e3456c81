"""SVD at 1.5 GB per worker: naive ``chunks="auto"`` + dask.array.linalg vs memchunk.

    python benchmarks/svd_experiment.py            # both fields
    python benchmarks/svd_experiment.py --small    # 10x smaller fields, for a quick look
    python benchmarks/svd_experiment.py --manual 2000x2000 4000x10000 10000x5000
    python benchmarks/svd_experiment.py --only-held --repeats 3   # input held between passes
    python benchmarks/svd_experiment.py --compare-hold --repeats 3  # held vs produced per pass
    python benchmarks/svd_experiment.py --compare-hold 20000x50000 --repeats 2  # held + spilled

Fields are float32 (time, space), generated lazily on the workers. Cases:

- (time=20000, space=4000), 320 MB: an exact SVD plan should fit;
- (time=20000, space=50000), 4 GB, k=10: only the compressed SVD fits; the input does not
  fit in the workers' memory, so memchunk produces it again for each pass;
- (time=20000, space=8000), 640 MB, k=10: the compressed SVD's input fits under the workers'
  spill line, so memchunk holds it between passes (``--only-held`` runs these cases only).

"naive" rechunks to ``chunks="auto"`` and calls ``da.linalg.svd`` (first field) or
``da.linalg.svd_compressed(k=10)`` (second); "memchunk" calls
``.memchunk.apply("svd", sample_dims="time", k=...)`` with ``method="auto"``. Both compressed
SVDs use the same ``n_power_iter`` (Dask's default, 0, unless ``--n-power-iter`` is given).
Each case runs on a fresh ``LocalCluster(n_workers=2, threads_per_worker=1)``.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics

import dask
import dask.array as da
import xarray as xr
from distributed import Client, LocalCluster

import xarray_memchunk  # noqa: F401
from xarray_memchunk import InfeasiblePlanError
from xarray_memchunk.testing import run_watched
from xarray_memchunk.units import format_bytes


def field(n_time: int, n_space: int) -> xr.DataArray:
    data = da.random.default_rng(0).standard_normal((n_time, n_space), chunks=(1000, 1000))
    return xr.DataArray(data.astype("float32"), dims=("time", "space"), name="field")


def manual_cases(small: bool, power: int, shapes: list[str]):
    """memchunk's compressed SVD on the wide field with chunks given as ``TIMExSPACE``."""
    scale = 10 if small else 1
    wide = field(20000 // scale, 50000 // scale)
    result = []
    for shape in shapes:
        t, s = (int(v) for v in shape.split("x"))
        chunks = {"time": t, "space": s}
        result.append(
            (
                f"20000x50000 manual {shape}",
                lambda c=chunks: (
                    wide.memchunk.apply(
                        "svd", sample_dims="time", k=10, n_power_iter=power, chunks=c
                    ).S
                ),
                None,
            )
        )
    return result


def cases(small: bool, power: int):
    scale = 10 if small else 1
    exact = field(20000 // scale, 4000 // scale)
    wide = field(20000 // scale, 50000 // scale)
    held = field(20000 // scale, 8000 // scale)
    return [
        ("20000x4000 naive", lambda: da.linalg.svd(exact.data.rechunk("auto"))[1], None),
        (
            "20000x4000 memchunk",
            lambda: exact.memchunk.apply("svd", sample_dims="time").S,
            lambda: exact.memchunk.plan("svd", sample_dims="time"),
        ),
        (
            "20000x4000 memchunk k=10",
            lambda: exact.memchunk.apply("svd", sample_dims="time", k=10).S,
            lambda: exact.memchunk.plan("svd", sample_dims="time", k=10),
        ),
        (
            "20000x50000 naive k=10",
            lambda: da.linalg.svd_compressed(
                wide.data.rechunk("auto"), 10, n_power_iter=power, seed=0
            )[1],
            None,
        ),
        (
            "20000x50000 memchunk k=10",
            lambda: wide.memchunk.apply("svd", sample_dims="time", k=10, n_power_iter=power).S,
            lambda: wide.memchunk.plan("svd", sample_dims="time", k=10, n_power_iter=power),
        ),
        (
            "20000x8000 naive k=10",
            lambda: da.linalg.svd_compressed(
                held.data.rechunk("auto"), 10, n_power_iter=power, seed=0
            )[1],
            None,
        ),
        (
            "20000x8000 memchunk k=10",
            lambda: held.memchunk.apply("svd", sample_dims="time", k=10, n_power_iter=power).S,
            lambda: held.memchunk.plan("svd", sample_dims="time", k=10, n_power_iter=power),
        ),
    ]


def compare_hold(shape: str, memory_limit: str, repeats: int) -> None:
    """memchunk's compressed SVD (k=10, n_power_iter=0) with its input held vs produced per pass.

    ``HOLD_MARGIN = inf`` holds the input whatever its size (Dask spills what is over its
    target to disk); ``0`` leaves no room to hold it, so each pass produces it again. The naive
    call (``chunks="auto"``, ``svd_compressed`` holding its input) runs beside them. Runs
    alternate; medians are printed.
    """
    from xarray_memchunk.operators.svd import compressed

    n_time, n_space = (int(v) for v in shape.split("x"))
    data = field(n_time, n_space)
    builds = {
        "naive": lambda: da.linalg.svd_compressed(data.data.rechunk("auto"), 10, seed=0)[1],
        "held": lambda: data.memchunk.apply("svd", sample_dims="time", k=10, n_power_iter=0).S,
        "per pass": lambda: data.memchunk.apply("svd", sample_dims="time", k=10, n_power_iter=0).S,
    }
    margins = {"naive": compressed.HOLD_MARGIN, "held": math.inf, "per pass": 0.0}
    runs: dict[str, list] = {}
    for r in range(repeats):
        for label in list(builds)[:: 1 - 2 * (r % 2)]:
            default, compressed.HOLD_MARGIN = compressed.HOLD_MARGIN, margins[label]
            with (
                LocalCluster(
                    n_workers=2,
                    threads_per_worker=1,
                    memory_limit=memory_limit,
                    dashboard_address=":0",
                ) as cluster,
                Client(cluster) as client,
            ):
                outcome = run_watched(client, label, builds[label])
            compressed.HOLD_MARGIN = default
            runs.setdefault(label, []).append(outcome)
            print(f"{label:<9} {outcome.seconds:6.2f} s  {format_bytes(outcome.peak_bytes)}")
    for label, outcomes in runs.items():
        print(
            f"{label:<9} median {statistics.median(o.seconds for o in outcomes):6.2f} s  "
            f"peak/worker {format_bytes(max(o.peak_bytes for o in outcomes))}  pauses "
            f"{sum(o.pauses for o in outcomes)} deaths {sum(o.worker_deaths for o in outcomes)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="1.5GB")
    parser.add_argument("--small", action="store_true")
    parser.add_argument(
        "--n-power-iter",
        type=int,
        default=0,
        help="power iterations for both compressed SVDs (dask's default: 0)",
    )
    parser.add_argument("--only-wide", action="store_true", help="run the 20000x50000 cases only")
    parser.add_argument("--only-held", action="store_true", help="run the 20000x8000 cases only")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per case, order reversed on each repeat"
    )
    parser.add_argument(
        "--manual",
        nargs="*",
        default=[],
        metavar="TIMExSPACE",
        help="also run memchunk's compressed SVD on the wide field with these chunks",
    )
    parser.add_argument(
        "--compare-hold",
        nargs="?",
        const="20000x8000",
        metavar="TIMExSPACE",
        help="memchunk's compressed SVD of a field (default 20000x8000) with its input held vs "
        "produced per pass, and the naive call",
    )
    args = parser.parse_args()
    for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if args.compare_hold:
        compare_hold(args.compare_hold, args.memory_limit, max(args.repeats, 1))
        return
    rows = []
    selected = cases(args.small, args.n_power_iter)
    if args.only_wide:
        selected = [c for c in selected if c[0].startswith("20000x50000")]
    if args.only_held:
        selected = [c for c in selected if c[0].startswith("20000x8000")]
    selected += manual_cases(args.small, args.n_power_iter, args.manual)
    order = [c for r in range(args.repeats) for c in (selected if r % 2 == 0 else selected[::-1])]
    for label, build, plan in order:
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 3}),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                memory_limit=args.memory_limit,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            note = ""
            if plan is not None:
                try:
                    p = plan()
                except InfeasiblePlanError as exc:
                    print(f"{label:<26} refused before running: {str(exc)[:150]}", flush=True)
                    continue
                note = f"  chunks {p.chunks}, predicted {format_bytes(p.predicted_peak_bytes)}"
            outcome = run_watched(client, label, build)
        rows.append((outcome, note))
        print(
            f"{label:<26} {'completed' if outcome.completed else 'FAILED':<9} "
            f"{outcome.seconds:>7.1f} s  peak/worker {format_bytes(outcome.peak_bytes):>10}  "
            f"pauses {outcome.pauses} deaths {outcome.worker_deaths}  "
            f"{outcome.error[:70]}{note}",
            flush=True,
        )
    if args.repeats > 1:
        print("\nmedian of each case:")
        for label in dict.fromkeys(o.label for o, _ in rows):
            runs = [o for o, _ in rows if o.label == label]
            done = sorted(o.seconds for o in runs if o.completed)
            median = f"{statistics.median(done):7.1f} s" if done else "      - "
            print(
                f"{label:<26} {len(done)}/{len(runs)} completed {median}  peak/worker "
                f"{format_bytes(max(o.peak_bytes for o in runs)):>10}  pauses "
                f"{sum(o.pauses for o in runs)} deaths {sum(o.worker_deaths for o in runs)}"
            )


if __name__ == "__main__":
    main()

"""How the exact SVD's time depends on its blocks, measured against the planner's estimate.

    python benchmarks/tsqr_blocks.py                    # 60000 x 500 and 30000 x 1500 float32
    python benchmarks/tsqr_blocks.py --matrices 20000x800 --repeats 1

For each matrix (random float32) and each tsqr algorithm (``one-pass``: Dask's; ``two-pass``:
memchunk's), memchunk's exact SVD runs on blocks of several heights (``chunks={"time":
rows}``, from the matrix's shorter side up) and on the blocks it plans itself, on one
``LocalCluster`` of 2 workers x 1 thread x ``--memory-limit``. Each run's input is first
persisted in the workers in the run's own blocks, so that neither a read nor a rechunk is
timed; ``U``, ``S`` and ``V`` are computed (summed). The table gives, per height, the
planner's estimate (``plan.estimated_seconds``: it ranks plans, it is no forecast), whether the
plan fits the budget, and the median measured wall time: where the estimate ranks the heights
as the measurements do, the planner picks well. Runs alternate the order of the heights on
each repeat.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import dask.array as da
import xarray as xr
from distributed import Client, LocalCluster, wait

import xarray_memchunk  # noqa: F401  (the .memchunk accessor)


def heights(n_rows: int, n_cols: int) -> list[int]:
    """Block heights to try: from the shorter side (two-pass tsqr's least) to a quarter."""
    found = {n_cols * f for f in (1, 2, 4, 8, 16, 32) if n_cols * f <= n_rows // 4}
    return sorted(found | {max(n_cols, n_rows // 4)})


def one_run(x: xr.DataArray, tsqr: str, rows: int | None) -> tuple[int, float, bool, float]:
    """Plan (given ``rows`` or its own), then time U, S, V on its blocks already in memory.

    Returns the rows, the estimate, whether the plan fits its budget, and the seconds.
    """
    kwargs = {"sample_dims": "time", "method": "exact", "tsqr": tsqr, "measure": "never"}
    plan = x.memchunk.plan("svd", chunks={"time": rows} if rows else None, **kwargs)
    held = x.chunk({"time": plan.chunks["time"]}).persist()
    wait(held)
    result = held.memchunk.plan("svd", chunks={"time": plan.chunks["time"]}, **kwargs).apply()
    total = sum(result[v].astype("float64").sum() for v in ("U", "S", "V"))
    start = time.perf_counter()
    total.compute()
    seconds = time.perf_counter() - start
    del held, result, total
    return plan.chunks["time"], plan.estimated_seconds, plan.fits, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", nargs="*", default=["60000x500", "30000x1500"])
    parser.add_argument("--memory-limit", default="6GB", help="per worker (2 workers x 1 thread)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    lines = [
        "| matrix | tsqr | block rows | blocks | estimate s | fits | measured s (median) "
        "| runs s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            memory_limit=args.memory_limit,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster),
    ):
        for shape in args.matrices:
            n_rows, n_cols = (int(v) for v in shape.split("x"))
            data = da.random.default_rng(0).random((n_rows, n_cols), chunks=(n_cols, n_cols))
            x = xr.DataArray(data.astype("float32"), dims=("time", "space"))
            for tsqr in ("one-pass", "two-pass"):
                cases: list[int | None] = [*heights(n_rows, n_cols), None]
                runs: dict[int | None, list[tuple]] = {case: [] for case in cases}
                for repeat in range(args.repeats):
                    for case in cases if repeat % 2 == 0 else cases[::-1]:
                        runs[case].append(one_run(x, tsqr, case))
                for case, found in runs.items():  # each algorithm's rows as they come
                    rows, estimate, fits = found[0][:3]
                    seconds = [s for *_, s in found]
                    label = f"{rows} (planned)" if case is None else str(rows)
                    lines.append(
                        f"| {shape} | {tsqr} | {label} | {-(-n_rows // rows)} | {estimate:.2f} | "
                        f"{'yes' if fits else 'no'} | {statistics.median(seconds):.2f} | "
                        f"{', '.join(f'{s:.2f}' for s in seconds)} |"
                    )
                print("\n".join(lines[-len(runs) :]), flush=True)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

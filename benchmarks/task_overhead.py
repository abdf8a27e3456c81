"""What one Dask task costs its thread beyond its work, per scheduler: the planner's task overhead.

    python benchmarks/task_overhead.py            # threaded scheduler and a 2 x 1 LocalCluster

A graph of N one-row chunks whose work is negligible (``(ones + 1).sum()``) is computed;
the cost per chunk to a thread is ``wall x threads / N``: what the planner counts per chunk of
a plan, the tasks that make and reduce a chunk and its share of the combine tasks included
(the optimized graph's tasks are shown too). Median of ``--repeats`` runs per N.
The planner's defaults (``planning.problem.TASK_OVERHEAD_S`` and
``DISTRIBUTED_TASK_OVERHEAD_S``) are these figures, rounded; the dask config key
``memchunk.task-overhead`` replaces them.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import dask
import dask.array as da
from distributed import Client, LocalCluster

from xarray_memchunk.planning.problem import DISTRIBUTED_TASK_OVERHEAD_S, TASK_OVERHEAD_S


def per_task_ms(n_chunks: int, threads: int, repeats: int) -> tuple[int, float, float]:
    """Tasks in the optimized graph, median wall seconds, and ms per chunk per thread."""
    total = (da.ones((n_chunks, 10), chunks=(1, 10)) + 1).sum()
    (optimized,) = dask.optimize(total)
    tasks = len(optimized.__dask_graph__())
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        total.compute()
        walls.append(time.perf_counter() - start)
    wall = statistics.median(walls)
    return tasks, wall, 1000 * wall * threads / n_chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="*", default=[500, 2000])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [
        "| scheduler | chunks | graph tasks | median wall s | ms per chunk per thread | planner's |"
    ]
    rows.append("| --- | --- | --- | --- | --- | --- |")
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        for n in args.chunks:
            tasks, wall, ms = per_task_ms(n, args.threads, args.repeats)
            rows.append(
                f"| threads ({args.threads}) | {n} | {tasks} | {wall:.2f} | {ms:.2f} | "
                f"{1000 * TASK_OVERHEAD_S:g} |"
            )
    with (
        LocalCluster(
            n_workers=args.threads,
            threads_per_worker=1,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster),
    ):
        for n in args.chunks:
            tasks, wall, ms = per_task_ms(n, args.threads, args.repeats)
            rows.append(
                f"| LocalCluster ({args.threads} x 1) | {n} | {tasks} | {wall:.2f} | {ms:.2f} | "
                f"{1000 * DISTRIBUTED_TASK_OVERHEAD_S:g} |"
            )
    print("\n".join(rows))


if __name__ == "__main__":
    main()

"""Long tasks on single-thread workers: the scheduler's queue depth against the last wave.

    python benchmarks/queue_tail.py                 # 3 repeats, about 3 minutes on 2 cores
    python benchmarks/queue_tail.py --repeats 5 --out /tmp/queue_tail.md
    python benchmarks/queue_tail.py --cases "memchunk median" --cube /tmp/w/cube.zarr

With ``distributed.scheduler.worker-saturation`` at its default of 1.1, the scheduler sends a
1-thread worker ``ceil(1.1 x 1) = 2`` root tasks: one runs and one waits behind it. The
waiting one is committed a task's duration ahead, before it is known which worker frees first:
where tasks take a second and their durations differ (the first task of a fresh worker loads
its kernels; edge blocks are smaller), one worker may end with two tasks to run while the other
idles. At 1.0 a worker gets its next task when it asks for it.

Four cases on fresh ``LocalCluster``s of 2 workers x 1 thread x 1 GB, at 1.1 and at 1.0 in
alternating order:

- ``sleeps``: 8 blocks whose task sleeps 0.8-1.35 s (the first two longest), then a sum: Dask
  alone, no memchunk;
- ``memchunk gst3d``: ``memchunk.apply("gst3d")`` of a 384^3 float32 volume in 128^3 Zarr
  chunks (the volume of ``benchmarks/floors.py``), summed;
- ``dask map_overlap``: the same kernel by ``map_overlap`` on the store's chunks, summed;
- ``memchunk median``: ``memchunk.apply("median", dim="time")`` of the climate cube of
  ``benchmarks/floors.py`` (2.42 GB, one-day Zarr chunks; ``--cube`` reuses one that
  ``peers.make_cube`` wrote), which stages the cube as it is applied, before the timer: the
  timer holds its 10 reductions of 2920 x 288 x 72 float32 blocks, 0.2 s each;
- ``median gathered``: the same median's blocks computed as they are (``.compute()`` of its
  Dask array) rather than summed. Dask's low-level fusion leaves, for each block it is asked
  for, a task that names the fused task's result (an ``Alias``). It is sent to the worker
  when the reduction ends, and there waits behind the worker's second, already started,
  holding its place in the scheduler's count: a worker of 1 thread is then sent its next
  reductions two at a time, when both have run. Summed, a block's result goes to a sum that
  waits for several blocks, and nothing waits on the worker.

The graph is built (and memchunk's plan made) before the timer. Prints a Markdown table: the
median wall seconds per case and setting, and how many of each run's long tasks (at least
:data:`LONG_TASK_S`) each worker ran; ``map_overlap``'s 27 chunks of 128^3 mostly run
shorter, so its counts say little.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import dask
import dask.array as da
import xarray as xr
from distributed import get_task_stream
from floors import _import_libraries, make_volume
from harness.fresh import fresh_client
from peers import GST3D_HALO, make_cube

import xarray_memchunk  # the accessor, and remove_staged_stores
from xarray_memchunk.clusters import WORKER_SATURATION_KEY
from xarray_memchunk.operators.gst3d.kernels import gst3d_block

CASES = ("sleeps", "memchunk gst3d", "dask map_overlap", "memchunk median", "median gathered")
#: Tasks at least this long count as a block's task in the per-worker counts (the median's
#: reductions take 0.2 s; its other tasks, mapping a staged chunk, under 1 ms).
LONG_TASK_S = {"memchunk median": 0.1, "median gathered": 0.1}
#: The same for the other cases.
LONG_TASK_DEFAULT_S = 0.3


def _sleep_block(block, block_info=None):
    """Sleep 0.8 s, 0.45 s more for the first two blocks, 0-0.2 s more by position."""
    index = block_info[0]["chunk-location"][0]
    time.sleep(0.8 + (0.45 if index < 2 else 0.0) + 0.1 * (index % 3))
    return block


def _work(case: str, volume: Path | None, cube: Path | None):
    """The lazy sum that ``case`` computes."""
    if case == "sleeps":
        blocks = da.ones((8 * 100, 100), chunks=(100, 100))
        return blocks.map_blocks(_sleep_block, dtype=blocks.dtype).sum()
    if case in ("memchunk median", "median gathered"):
        tas = xr.open_zarr(cube)["tas"]
        median = tas.memchunk.apply("median", dim="time").data
        return median if case == "median gathered" else median.astype("float64").sum()
    amplitude = xr.open_zarr(volume)["amplitude"]
    if case == "memchunk gst3d":
        return amplitude.memchunk.apply("gst3d").data.astype("float64").sum()
    dip = amplitude.data.map_overlap(gst3d_block, depth=GST3D_HALO, boundary="none", dtype="f4")
    return dip.astype("float64").sum()


def run(case: str, saturation: float, volume: Path, cube: Path | None) -> tuple[float, list[int]]:
    """Wall seconds of one run on a fresh cluster, and the long tasks per worker (most first)."""
    with dask.config.set({WORKER_SATURATION_KEY: saturation}), fresh_client(2, 1, "1GB") as client:
        client.run(_import_libraries)
        work = _work(case, volume, cube)  # planned (and staged) before the timer
        workers = client.scheduler_info()["workers"]  # a worker that ran none counts 0
        with get_task_stream(client) as stream:
            start = time.perf_counter()
            work.compute()
            seconds = time.perf_counter() - start
    xarray_memchunk.remove_staged_stores()
    long_tasks = collections.Counter(
        task["worker"]
        for task in stream.data
        if any(
            s["action"] == "compute"
            and s["stop"] - s["start"] >= LONG_TASK_S.get(case, LONG_TASK_DEFAULT_S)
            for s in task["startstops"]
        )
    )
    return seconds, sorted((long_tasks[w] for w in workers), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "queue_tail.md"))
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--cube", type=Path, default=None, help="the climate cube, if written")
    args = parser.parse_args()
    settings = (1.1, 1.0)
    seconds: dict[tuple[str, float], list[float]] = collections.defaultdict(list)
    splits: dict[tuple[str, float], list[str]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        medians = {"memchunk median", "median gathered"}
        volume = make_volume(Path(tmp), 1.0) if set(args.cases) - medians else None
        cube = args.cube
        if cube is None and medians & set(args.cases):
            cube = make_cube(Path(tmp), 1.0)
        for repeat in range(args.repeats):
            order = settings if repeat % 2 == 0 else settings[::-1]
            for case in args.cases:
                for saturation in order:
                    wall, per_worker = run(case, saturation, volume, cube)
                    seconds[case, saturation].append(wall)
                    splits[case, saturation].append("/".join(map(str, per_worker)))
                    print(
                        f"[{repeat + 1}/{args.repeats}] {case:17s} {saturation:.1f} "
                        f"{wall:.2f} s  tasks per worker {splits[case, saturation][-1]}",
                        flush=True,
                    )
    chosen = " ".join(f'"{c}"' for c in args.cases)
    chosen = "" if args.cases == list(CASES) else f" --cases {chosen}"
    lines = [
        f"`python benchmarks/queue_tail.py --repeats {args.repeats}{chosen}`: 2 workers x 1 "
        f"thread x 1 GB, a fresh cluster per run; median of {args.repeats}; dask "
        f"{dask.__version__}.",
        "",
        "| case | worker-saturation | wall s (median) | every run s | long tasks per worker |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in args.cases:
        for saturation in settings:
            runs = seconds[case, saturation]
            lines.append(
                f"| {case} | {saturation:.1f} | {statistics.median(runs):.2f} | "
                f"{', '.join(f'{s:.2f}' for s in runs)} | {', '.join(splits[case, saturation])} |"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    Path(args.out).write_text(table)


if __name__ == "__main__":
    main()

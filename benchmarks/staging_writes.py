"""How a staged store is written: through zarr, or chunk file by chunk file, and in what groups.

    python benchmarks/staging_writes.py                    # the 2.42 GB cube, 2 repeats
    python benchmarks/staging_writes.py --scale 0.5 --directory /tmp

Copies the climate cube of ``benchmarks/floors.py`` (2920 x 288 x 720 float32, one-day zstd
Zarr chunks) into an uncompressed store of 2920 x 288 x 72 chunks (a median's planned blocks)
in ``--directory``, in write tasks of 130 days, as a staged plan does:

- in one thread: ``zarr`` (each task's block decoded directly, then written by zarr into
  store chunks of 130 x 288 x 72, as before slabs), and
  :func:`~xarray_memchunk.operators.zarr_writes.copy_region` decoding one source chunk at a
  time, or groups of 4 MiB (the default, :data:`COPY_GROUP_BYTES`) and 16 MiB;
- on a ``LocalCluster`` of 2 workers x 1 thread, ``copy_region`` with each worker's reused
  buffers (:func:`~xarray_memchunk.operators.zarr_reads.scratch`) and with fresh ones (its
  size limit set to 0 in the workers).

Cases alternate their order on each repeat. Prints a Markdown table of each case's median
wall seconds and, for the cluster, task seconds summed over workers.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from harness.fresh import fresh_client
from peers import make_cube

from xarray_memchunk.operators import zarr_reads, zarr_writes
from xarray_memchunk.operators.zarr_reads import DirectChunkReads
from xarray_memchunk.operators.zarr_writes import DirectChunkWrites, copy_region

#: Days per write task, as the staged plan of the median on 2 x 1 GB workers takes.
WRITE_DAYS = 130


def _target(directory: Path, shape: tuple[int, ...], chunks: tuple[int, ...]) -> zarr.Array:
    path = directory / "staged.zarr"
    shutil.rmtree(path, ignore_errors=True)
    return zarr.create_array(
        str(path), shape=shape, chunks=chunks, dtype="float32", compressors=None, fill_value=0
    )


def _regions(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    rest = tuple(slice(0, n) for n in shape[1:])
    return [
        (slice(t, min(t + WRITE_DAYS, shape[0])), *rest) for t in range(0, shape[0], WRITE_DAYS)
    ]


def in_one_thread(reader: DirectChunkReads, directory: Path, case: str) -> float:
    """Seconds to copy the cube in one thread by ``case``."""
    shape = tuple(reader.array.shape)
    planned = (shape[0], shape[1], shape[2] // 10)
    start = time.perf_counter()
    if case == "zarr":
        target = _target(directory, shape, (WRITE_DAYS, *planned[1:]))
        for region in _regions(shape):
            block = np.empty(tuple(s.stop - s.start for s in region), "float32")
            reader.read_into(region, block)
            target[region] = block
    else:
        group = {"direct, one chunk": 1, "direct, 4 MiB": 4 * 2**20, "direct, 16 MiB": 16 * 2**20}
        saved, zarr_writes.COPY_GROUP_BYTES = zarr_writes.COPY_GROUP_BYTES, group[case]
        try:
            writer = DirectChunkWrites.of(_target(directory, shape, planned))
            for region in _regions(shape):
                copy_region(reader, writer, region)
        finally:
            zarr_writes.COPY_GROUP_BYTES = saved
    return time.perf_counter() - start


def _timed_copy(reader, writer, region) -> float:
    start = time.perf_counter()
    copy_region(reader, writer, region)
    return time.perf_counter() - start


def _scratch_limit(nbytes: int) -> None:
    zarr_reads.SCRATCH_BYTES = nbytes


def on_a_cluster(client, reader, directory: Path, reuse: bool) -> tuple[float, float]:
    """Wall and summed task seconds to copy the cube on the cluster's workers."""
    client.run(_scratch_limit, zarr_reads.SCRATCH_BYTES if reuse else 0)
    shape = tuple(reader.array.shape)
    writer = DirectChunkWrites.of(_target(directory, shape, (shape[0], shape[1], shape[2] // 10)))
    start = time.perf_counter()
    futures = [client.submit(_timed_copy, reader, writer, r, pure=False) for r in _regions(shape)]
    tasks = sum(client.gather(futures))
    return time.perf_counter() - start, tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="the cube's days x scale")
    parser.add_argument("--directory", default="/dev/shm", help="where the store is written")
    parser.add_argument("--cube", type=Path, help="a cube written before (peers.make_cube)")
    args = parser.parse_args()
    one_thread = ["zarr", "direct, one chunk", "direct, 4 MiB", "direct, 16 MiB"]
    seconds: dict[str, list[float]] = {c: [] for c in one_thread}
    tasks: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="memchunk-writes-") as tmp:
        cube = args.cube or make_cube(Path(tmp), args.scale)
        reader = DirectChunkReads.of(zarr.open_array(str(cube / "tas"), mode="r"))
        work = Path(tempfile.mkdtemp(prefix="memchunk-writes-", dir=args.directory))
        try:
            for repeat in range(args.repeats):
                for case in one_thread if repeat % 2 == 0 else one_thread[::-1]:
                    seconds[case].append(in_one_thread(reader, work, case))
            with fresh_client(2, 1, "1GB") as client:
                client.run(lambda: __import__("xarray_memchunk"))
                for repeat in range(args.repeats):
                    for reuse in (True, False) if repeat % 2 == 0 else (False, True):
                        case = f"2 workers, {'reused' if reuse else 'fresh'} buffers"
                        wall, summed = on_a_cluster(client, reader, work, reuse)
                        seconds.setdefault(case, []).append(wall)
                        tasks.setdefault(case, []).append(summed)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    nbytes = 4 * int(np.prod(reader.array.shape))
    print(f"Copying {nbytes / 1e9:.2f} GB into {args.directory}, median of {args.repeats}:\n")
    print("| case | wall s | task s summed | runs |")
    print("| --- | --- | --- | --- |")
    for case, values in seconds.items():
        summed = f"{statistics.median(tasks[case]):.2f}" if case in tasks else ""
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {case} | {statistics.median(values):.2f} | {summed} | {runs} |")


if __name__ == "__main__":
    main()

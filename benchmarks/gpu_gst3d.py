"""GST3D on a GPU (CuPy) against the CPU path, planned device peaks, and a naive out-of-memory.

    python benchmarks/gpu_gst3d.py --device cpu --sizes 400            # the 2-core CPU row
    python benchmarks/gpu_gst3d.py --device gpu --sizes 400 800 1200   # on a CUDA machine
    python benchmarks/gpu_gst3d.py --device gpu --oom 2048             # naive chunks vs plan

Every run computes GST3D dip on an N^3 float32 volume generated inside the graph (on the
device for ``gpu``), planned by memchunk for Dask's threaded scheduler with ``--threads``
workers, each result block copied to the host (as when results are written out). Times are
the median of ``--repeats`` runs after one warm-up run (CUDA's kernels compile on first use).

On the GPU each row also gives the predicted device peak (what is allocated on the GPU
before the run + threads x the plan's predicted peak per task slot) against the measured one
(allocated before + the most CuPy's memory pool held during the run; the pool is emptied
before it).

``--oom N``: an N^3 volume stored in inline slabs of 64 (chunks of 64 x N x N, as a SEG-Y or
Zarr store in inline order gives them), first run as a user would write it
(``map_overlap`` of the same fused kernel on the stored chunks), then as memchunk plans it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import dask
import numpy as np
import xarray as xr
from harness.device_data import noise, to_host

import xarray_memchunk as xm
from xarray_memchunk.operators.gst3d.kernels import gst3d_on_axes, halo_depth

DIMS = ("inline", "crossline", "sample")


def volume(n: int, chunks: tuple[int, int, int], device: str, seed: int = 0) -> xr.DataArray:
    """An N^3 float32 volume of uniform noise, made block by block inside the graph."""
    return noise((n, n, n), chunks, DIMS, device, seed)


def _pool():
    import cupy

    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    return pool


def _in_use() -> int:
    import cupy

    free, total = cupy.cuda.Device().mem_info
    return int(total - free)


def planned_run(n: int, device: str, chunks: tuple[int, int, int]) -> dict:
    """One planned GST3D run: seconds, chunks, predicted and measured device peak."""
    data = volume(n, chunks, device)
    plan = data.memchunk.plan("gst3d")
    dip = data.memchunk.apply("gst3d")
    row = {"chunks": "x".join(str(max(c)) for c in plan.dask_chunks.values())}
    if device == "gpu":
        pool = _pool()
        before = _in_use()
    start = time.perf_counter()
    to_host(dip.data).compute()
    row["seconds"] = time.perf_counter() - start
    if device == "gpu":
        row["predicted"] = plan.budget.worker_baseline + (
            plan.budget.threads_per_worker * plan.predicted_peak_bytes
        )
        row["measured"] = before + pool.total_bytes()
        row["budget"] = plan.budget.explain()
    return row


def throughput(args) -> list[str]:
    lines = [
        "| device | N | chunks | threads | median s | Mvoxel/s | runs s | predicted device "
        "peak GB | measured device peak GB | measured / predicted |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in args.sizes:
        chunks = (min(n, 256),) * 3
        planned_run(n, args.device, chunks)  # warm-up: kernels compile, the pool grows
        rows = [planned_run(n, args.device, chunks) for _ in range(args.repeats)]
        seconds = [r["seconds"] for r in rows]
        median = statistics.median(seconds)
        peaks = ("", "", "")
        if args.device == "gpu":
            worst = max(rows, key=lambda r: r["measured"])
            peaks = (
                f"{worst['predicted'] / 1e9:.2f}",
                f"{worst['measured'] / 1e9:.2f}",
                f"{worst['measured'] / worst['predicted']:.2f}",
            )
            print(worst["budget"], flush=True)
        lines.append(
            f"| {args.device} | {n} | {rows[0]['chunks']} | {args.threads} | {median:.2f} | "
            f"{n**3 / median / 1e6:.0f} | {', '.join(f'{s:.2f}' for s in seconds)} | "
            f"{' | '.join(peaks)} |"
        )
        print(lines[-1], flush=True)
    return lines


def oom(args) -> list[str]:
    """Naive stored chunks against the plan, on one N^3 volume."""
    import cupy

    n = args.oom
    stored = (64, n, n)
    lines = [
        "| run | chunks | outcome | seconds | device peak GB |",
        "| --- | --- | --- | --- | --- |",
    ]
    depth = halo_depth("gaussian", 1.0, 2.0, 3.0)
    for label in ("memchunk", "naive"):  # the naive run leaves the GPU full when it fails
        data = volume(n, stored, "gpu")
        if label == "naive":
            dip = data.data.map_overlap(
                gst3d_on_axes, depth=depth, boundary="none", dtype=np.float32
            )
            chunks = "x".join(map(str, stored))
        else:
            plan = data.memchunk.plan("gst3d")
            print(plan.explain(), flush=True)
            dip = data.memchunk.apply("gst3d").data
            chunks = "x".join(str(max(c)) for c in plan.dask_chunks.values())
        pool = _pool()
        before = _in_use()
        start = time.perf_counter()
        try:
            to_host(dip).compute()
            outcome = "completed"
        except cupy.cuda.memory.OutOfMemoryError as exc:
            outcome = f"CUDA out of memory: {str(exc)[:90]}"
            del exc
        seconds = time.perf_counter() - start
        peak = (before + pool.total_bytes()) / 1e9
        del dip
        _pool()
        lines.append(f"| {label} | {chunks} | {outcome} | {seconds:.1f} | {peak:.1f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--sizes", type=int, nargs="*", default=[400])
    parser.add_argument("--threads", type=int, default=None, help="default: one per CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--oom", type=int, default=0, metavar="N", help="naive vs plan on N^3")
    args = parser.parse_args()
    import os

    args.threads = args.threads or os.cpu_count()
    header = f"{platform.node()} ({os.cpu_count()} CPUs)"
    if args.device == "gpu" or args.oom:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        header += f", {props['name'].decode()}, {props['totalGlobalMem'] / 2**30:.1f} GiB"
    print(f"GST3D dip, float32; xarray-memchunk {xm.__version__}; {header}", flush=True)
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        lines = throughput(args) if args.sizes else []
        if args.oom:
            lines += ["", *oom(args)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

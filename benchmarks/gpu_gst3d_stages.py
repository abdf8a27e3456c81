"""Where GST3D's time goes on a GPU: one block's stages, the host copy, and the Dask run.

    python benchmarks/gpu_gst3d_stages.py                 # on a CUDA machine
    python benchmarks/gpu_gst3d_stages.py --block 274 --volume 400 800

Three tables:

1. **Agreement**: the tensor of the library's CUDA passes against the CPU kernel's
   (:func:`~xarray_memchunk.operators.gst3d.fused.structure_tensor`, SciPy's arithmetic) on a
   96^3 block, float32 and float64, both kernels: bit-identical or the largest difference; dip
   against the CPU's.
2. **One block** of ``--block``^3 float32 on the GPU (274 = a 256^3 task with its halo of 9):
   each stage timed by :func:`cupyx.profiler.benchmark` (GPU time, median of ``--repeats``):
   the gradients and tensor by the library's passes and by ``cupyx.scipy.ndimage`` (the
   earlier path), the eigen-analysis kernel, the whole block, and the result's copy to
   the host, pageable and pinned.
3. **Dask** (threaded scheduler, ``--threads``): an N^3 volume made on the GPU, planned by
   memchunk, with each result block copied to the host into pinned memory (from CuPy's pinned
   memory pool), into pageable memory (``.get()``), stored by ``dask.array.store`` into one
   preallocated pinned host array (:class:`~harness.device_data.HostTarget`: no staging, no
   concatenation), and not at all (a 1-voxel read of each block, so the work is done but
   little is copied); median of ``--repeats`` after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask
import dask.array as da
import numpy as np
from harness.device_data import HostTarget, noise, pinned_copy, to_host
from harness.gst3d_cupyx import cupyx_structure_tensor

from xarray_memchunk.operators.gst3d.fused import gst3d as cpu_gst3d
from xarray_memchunk.operators.gst3d.fused import structure_tensor as cpu_structure_tensor
from xarray_memchunk.operators.gst3d.gpu import gpu_attribute
from xarray_memchunk.operators.gst3d.gpu_filters import gpu_structure_tensor
from xarray_memchunk.operators.gst3d.kernels import gst3d_block

DIMS = ("inline", "crossline", "sample")
OPTIONS = {"sigma": 1.0, "rho": 2.0, "truncate": 3.0}


def agreement() -> list[str]:
    import cupy

    lines = [
        "| dtype | kernel | tensor | dip: largest difference, degrees |",
        "| --- | --- | --- | --- |",
    ]
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for kernel in ("gaussian", "d2geo"):
            x = rng.standard_normal((96, 96, 96)).astype(dtype)
            gpu = gpu_structure_tensor(cupy.asarray(x), kernel, **OPTIONS, dtype=dtype)
            got = np.stack([cupy.asnumpy(c).reshape(x.shape) for c in gpu])
            ref = cpu_structure_tensor(x, kernel=kernel, **OPTIONS)
            same = np.array_equal(got, ref)
            tensor = "bit-identical" if same else f"differs: {np.abs(got - ref).max():.3g}"
            dip_gpu = cupy.asnumpy(gst3d_block(cupy.asarray(x), kernel=kernel, **OPTIONS))
            dip_cpu = cpu_gst3d(x, kernel=kernel, **OPTIONS)
            lines.append(
                f"| {np.dtype(dtype).name} | {kernel} | {tensor} | "
                f"{np.abs(dip_gpu - dip_cpu).max():.2e} |"
            )
            print(lines[-1], flush=True)
    return lines


def _gpu_ms(func, args, repeats: int) -> float:
    from cupyx.profiler import benchmark

    result = benchmark(func, args, n_repeat=repeats, n_warmup=2)
    return float(np.median(result.gpu_times)) * 1e3


def one_block(n: int, repeats: int) -> list[str]:
    import cupy

    x = cupy.random.default_rng(0).random((n, n, n), dtype=np.float32)
    voxels = x.size
    tensor = gpu_structure_tensor(x, "gaussian", **OPTIONS, dtype=np.float32)
    out = cupy.empty(x.shape, np.float32)
    pinned = cupy.cuda.alloc_pinned_memory(out.nbytes)
    host = np.frombuffer(pinned, np.float32, out.size).reshape(out.shape)
    stages = {
        "tensor, CUDA passes (library)": (
            lambda: gpu_structure_tensor(x, "gaussian", **OPTIONS, dtype=np.float32)
        ),
        "tensor, cupyx.scipy.ndimage (earlier path)": lambda: cupyx_structure_tensor(x),
        "eigen-analysis (dip)": lambda: gpu_attribute(tensor, "dip", out.reshape(-1)),
        "whole block (gst3d_block)": lambda: gst3d_block(x, **OPTIONS),
        "copy to host, pageable (out.get())": lambda: out.get(),
        "copy to host, pinned": lambda: out.get(out=host),
        "copy to host, pinned, from CuPy's pool (to_host)": lambda: pinned_copy(out),
    }
    lines = [
        f"One {n}^3 float32 block ({voxels / 1e6:.1f} Mvoxel), GPU time per call, median of "
        f"{repeats}:",
        "",
        "| stage | ms | Mvoxel/s |",
        "| --- | --- | --- |",
    ]
    for name, func in stages.items():
        ms = _gpu_ms(func, (), repeats)
        lines.append(f"| {name} | {ms:.2f} | {voxels / ms / 1e3:.0f} |")
        print(lines[-1], flush=True)
    return lines


COPIES = ("pinned", "pageable", "stored", "none")


def _dask_run(n: int, copy: str, target: HostTarget | None) -> tuple[float, str]:
    data = noise((n, n, n), (min(n, 256),) * 3, DIMS, "gpu")
    plan = data.memchunk.plan("gst3d")
    dip = data.memchunk.apply("gst3d").data
    chunks = "x".join(str(max(c)) for c in plan.dask_chunks.values())
    if copy == "stored":
        start = time.perf_counter()
        da.store(dip, target, lock=False)
        return time.perf_counter() - start, chunks
    if copy != "none":
        result = to_host(dip, pinned=copy == "pinned")
    else:
        meta = np.empty((0, 0, 0), np.float32)
        result = dip.map_blocks(lambda b: b[:1, :1, :1].get(), chunks=(1, 1, 1), meta=meta)
    start = time.perf_counter()
    result.compute()
    return time.perf_counter() - start, chunks


def dask_runs(sizes: list[int], threads: list[int], repeats: int) -> list[str]:
    lines = [
        "| N | threads | chunks | results copied to the host, memory | median s | Mvoxel/s | "
        "runs s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in sizes:
        target = HostTarget((n, n, n), np.float32)
        for count in threads:
            with dask.config.set(scheduler="threads", num_workers=count):
                for copy in COPIES:
                    _dask_run(n, copy, target)  # warm-up
                    runs = [_dask_run(n, copy, target) for _ in range(repeats)]
                    seconds = [s for s, _ in runs]
                    median = statistics.median(seconds)
                    lines.append(
                        f"| {n} | {count} | {runs[0][1]} | {copy} | "
                        f"{median:.3f} | {n**3 / median / 1e6:.0f} | "
                        f"{', '.join(f'{s:.3f}' for s in seconds)} |"
                    )
                    print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=274)
    parser.add_argument("--volume", type=int, nargs="*", default=[400, 800])
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-agreement", action="store_true")
    args = parser.parse_args()
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"{props['name'].decode()}, CuPy {cupy.__version__}, dask {dask.__version__}")
    lines = [] if args.skip_agreement else [*agreement(), ""]
    lines += [*one_block(args.block, args.repeats), ""]
    lines += dask_runs(args.volume, args.threads, args.repeats)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

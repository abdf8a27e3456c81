"""Planned runs on a GPU: does each operator's device peak stay within what its plan predicted?

    python benchmarks/gpu_plan_safety.py                      # every case, 2 GiB planned
    python benchmarks/gpu_plan_safety.py --memory-limit 4GiB --only median svd-two-pass

The GPU analogue of ``plan_safety.py``. Each case plans CuPy-backed float32 data (generated on
the device inside the graph, in source chunks that the plan has to cut) against a stated device
memory (``memory_limit``, so the plan is bound by memory although the GPU is larger), runs it
with Dask's threaded scheduler (``--threads`` tasks at once on the one GPU), and compares the
device memory the run used with the plan's prediction: threads x the predicted peak of one
task slot. Used memory is CuPy's pool's ``used_bytes``, sampled every 0.5 ms (its peak, "in
use"); the pool's size at the end (the pool emptied before the run) is given too: it also
counts freed blocks the pool kept, which CuPy hands back to CUDA before it would run out. A
ratio at or below 1 means the plan held. Results are copied to the host block by block, as
when they are written out.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time

import dask
import xarray as xr
from harness.device_data import noise, to_host

import xarray_memchunk as xm

#: (label, operator, kwargs, shape, source chunks, dims)
CASES = [
    (op, op, {"dim": "time"}, (1460, 400, 400), (73, 200, 200), ("time", "y", "x"))
    for op in ("sum", "mean", "std", "var", "min", "max", "median")
] + [
    (
        "quantile",
        "quantile",
        {"dim": "time", "q": 0.9},
        (1460, 400, 400),
        (73, 200, 200),
        ("time", "y", "x"),
    ),
    ("gst3d", "gst3d", {}, (512, 512, 512), (64, 512, 512), ("inline", "crossline", "sample")),
    (
        "svd-exact",
        "svd",
        {"sample_dims": "time", "method": "exact", "tsqr": "one-pass"},
        (100000, 500),
        (5000, 500),
        ("time", "space"),
    ),
    (
        "svd-two-pass",
        "svd",
        {"sample_dims": "time", "method": "exact", "tsqr": "two-pass"},
        (100000, 500),
        (5000, 500),
        ("time", "space"),
    ),
    (
        "svd-compressed",
        "svd",
        {"sample_dims": "time", "method": "compressed", "k": 10},
        (20000, 50000),
        (1000, 50000),
        ("time", "space"),
    ),
]


class _PeakInUse:
    """Samples CuPy's pool's bytes in use on a thread of its own; ``peak`` is the most seen."""

    def __init__(self, pool, interval: float = 5e-4):
        self.pool, self.interval, self.peak = pool, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.pool.used_bytes())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.pool.used_bytes())


def _to_host(result):
    """Every variable's blocks copied to the host: what computing it hands back."""
    arrays = result.data_vars.values() if isinstance(result, xr.Dataset) else [result]
    return [to_host(a.data) for a in arrays]


def run_case(case, memory_limit: str, threads: int) -> str:
    """One planned run: its table row."""
    import cupy

    label, op, kwargs, shape, chunks, dims = case
    data = noise(shape, chunks, dims)
    pool = cupy.get_default_memory_pool()
    try:
        plan = data.memchunk.plan(op, memory_limit=memory_limit, **kwargs)
        result = data.memchunk.apply(op, memory_limit=memory_limit, **kwargs)
    except xm.MemchunkError as exc:
        return f"| {label} | | | | | | | | refused: {str(exc)[:120]} | |"
    predicted = threads * plan.predicted_peak_bytes
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    start = time.perf_counter()
    with _PeakInUse(pool) as in_use:
        try:
            dask.compute(*_to_host(result))
            outcome = "completed"
        except cupy.cuda.memory.OutOfMemoryError as exc:
            outcome = f"CUDA out of memory: {str(exc)[:80]}"
    seconds = time.perf_counter() - start
    pool_size = pool.total_bytes()
    pool.free_all_blocks()
    sizes = "x".join(str(max(c)) for c in plan.dask_chunks.values())
    mib = 2**20
    return (
        f"| {label} | {sizes} | {plan.binding} | {plan.predicted_peak_bytes / mib:.0f} | "
        f"{predicted / mib:.0f} | {in_use.peak / mib:.0f} | {in_use.peak / predicted:.2f} | "
        f"{pool_size / mib:.0f} | {outcome} | {seconds:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="2GiB", help="device memory to plan for")
    parser.add_argument("--threads", type=int, default=4, help="tasks at once on the GPU")
    parser.add_argument("--only", nargs="*", help="case labels to run")
    args = parser.parse_args()
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(
        f"xarray-memchunk {xm.__version__}; {platform.node()}, {props['name'].decode()}; "
        f"float32; memory_limit={args.memory_limit}; {args.threads} threads; dask "
        f"{dask.__version__}, cupy {cupy.__version__}",
        flush=True,
    )
    header = [
        "| case | chunks | binding | predicted slot MiB | predicted MiB (threads x slot) "
        "| in use, peak MiB | in use / predicted | pool size at end MiB | outcome | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    print("\n".join(header), flush=True)
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        for case in CASES:
            if args.only and case[0] not in args.only:
                continue
            print(run_case(case, args.memory_limit, args.threads), flush=True)


if __name__ == "__main__":
    main()

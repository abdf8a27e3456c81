"""Median and quantile kernels of one task against NumPy's functions, on one thread.

    python benchmarks/reduction_kernels.py             # 2920 x 288 x 72 float32, best of 3
    python benchmarks/reduction_kernels.py --shape 1460 288 45

The block is a task's block as the kernels get it: time first in memory, moved last (a strided
view), and the same block copied time-last (contiguous). Each row: NumPy's function over the
time axis (``np.median``, ``np.quantile(q=0.9)``), slab by slab as the kernels walk the block,
and memchunk's kernel (``whole_dims._medians``, ``whole_dims._quantiles_last``). Prints a
Markdown table; the values are checked equal first.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from xarray_memchunk.operators.slabs import slabs
from xarray_memchunk.operators.whole_dims import SLAB_ELEMENTS, _medians, _quantiles_last

Q = np.array([0.9])


def _numpy_by_slab(block: np.ndarray, op: str) -> np.ndarray:
    """NumPy's function on each slab of ``block`` (views), as the kernels did before."""
    shape = block.shape[:-1] + ((len(Q),) if op == "quantile" else ())
    out = np.empty(shape, "float64" if op == "quantile" else block.dtype)
    for index in slabs(block.shape, block.ndim - 1, SLAB_ELEMENTS):
        if op == "median":
            out[index] = np.median(block[index], axis=-1)
        else:
            out[index] = np.moveaxis(np.quantile(block[index], Q, axis=-1), 0, -1)
    return out


def _kernel(block: np.ndarray, op: str) -> np.ndarray:
    if op == "median":
        return _medians(block, (-1,), block.dtype)
    return _quantiles_last(block, np.nanquantile, Q, (-1,), "linear", np.dtype("float64"))


def _best(func, *args, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        func(*args)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(2920, 288, 72), help="time y x")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = np.random.default_rng(0).standard_normal(args.shape, dtype="float32")
    layouts = {
        "time strided": np.moveaxis(data, 0, -1),
        "time contiguous": np.ascontiguousarray(np.moveaxis(data, 0, -1)),
    }
    print(f"block {' x '.join(map(str, args.shape))} float32, one thread, best of {args.repeats}")
    print()
    print("| kernel | layout | NumPy by slab s | memchunk s | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    for op in ("median", "quantile"):
        for layout, block in layouts.items():
            np.testing.assert_array_equal(_kernel(block, op), _numpy_by_slab(block, op))
            numpy_s = _best(_numpy_by_slab, block, op, repeats=args.repeats)
            ours = _best(_kernel, block, op, repeats=args.repeats)
            label = op if op == "median" else "quantile q=0.9"
            print(f"| {label} | {layout} | {numpy_s:.3f} | {ours:.3f} | {numpy_s / ours:.1f}x |")


if __name__ == "__main__":
    main()

"""Data made on the CPU or the GPU inside a Dask graph, and results copied back to the host.

Shared by the GPU benchmarks (``benchmarks/gpu_gst3d.py``, ``benchmarks/gpu_plan_safety.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import dask.array as da
import numpy as np
import xarray as xr

__all__ = ["HostTarget", "noise", "pinned_copy", "to_host"]


def _block(x, block_id=None, xp=np, seed: int = 0):
    rng = xp.random.default_rng(seed + sum(i * 1000**k for k, i in enumerate(block_id)))
    return rng.random(x.shape, dtype=np.float32)


def noise(
    shape: Sequence[int],
    chunks: Sequence[int],
    dims: Sequence[str],
    device: str = "gpu",
    seed: int = 0,
) -> xr.DataArray:
    """Uniform float32 noise made block by block inside the graph, on ``device``.

    Each block is generated in float32 on the device it lives on (CuPy for ``"gpu"``), from a
    seed that depends on ``seed`` and the block's position only.
    """
    if device == "gpu":
        import cupy as xp
    else:
        xp = np
    template = da.empty(tuple(shape), chunks=tuple(chunks), dtype=np.float32)
    data = da.map_blocks(
        _block,
        template,
        xp=xp,
        seed=seed,
        dtype=np.float32,
        meta=xp.empty((0,) * len(shape), dtype=np.float32),
    )
    return xr.DataArray(data, dims=tuple(dims))


def _pageable(block):
    return block.get() if hasattr(block, "get") else block


def pinned_copy(block):
    """``block`` copied into page-locked host memory from CuPy's pinned memory pool.

    The pool keeps what it allocated (outside any memory budget) until ``free_all_blocks()``;
    a copy into pageable memory is staged through the driver's own buffers and is ~15 times
    slower (``benchmarks/gpu_gst3d_stages.py``).
    """
    if not hasattr(block, "get") or block.size == 0:
        return _pageable(block)
    import cupy

    block = cupy.ascontiguousarray(block)
    memory = cupy.cuda.alloc_pinned_memory(block.nbytes)
    host = np.frombuffer(memory, block.dtype, block.size).reshape(block.shape)
    block.get(out=host)
    return host


def to_host(array: da.Array, pinned: bool = True) -> da.Array:
    """``array`` with every block copied to the host: a NumPy result, as when written out.

    Into pinned memory (:func:`pinned_copy`), or with ``pinned=False`` into pageable memory
    (``cupy.ndarray.get()``).
    """
    meta = np.empty((0,) * array.ndim, dtype=array.dtype)
    return array.map_blocks(pinned_copy if pinned else _pageable, meta=meta)


class HostTarget:
    """One preallocated page-locked host array that ``dask.array.store`` copies CuPy blocks into.

    The floor of a result that leaves the GPU: each block goes by DMA straight to its place in
    the one host array (plane by plane with ``cudaMemcpy2DAsync`` where the place is strided),
    with no pageable staging and no concatenation afterwards (what ``compute()`` does to
    make one NumPy array). The array is allocated once, as an output file would be.
    """

    def __init__(self, shape: Sequence[int], dtype) -> None:
        import cupy

        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        size = int(np.prod(self.shape))
        self._memory = cupy.cuda.alloc_pinned_memory(size * self.dtype.itemsize)
        self.array = np.frombuffer(self._memory, self.dtype, size).reshape(self.shape)

    def __setitem__(self, region, block) -> None:
        import cupy

        block = cupy.ascontiguousarray(block)
        view = self.array[region]
        if view.flags.c_contiguous:
            block.get(out=view)
            return
        stream = cupy.cuda.get_current_stream()
        for index in np.ndindex(*view.shape[:-2]):
            plane, source = view[index], block[index]
            cupy.cuda.runtime.memcpy2DAsync(
                plane.ctypes.data,
                plane.strides[0],
                source.data.ptr,
                source.strides[0],
                source.shape[1] * source.itemsize,
                source.shape[0],
                cupy.cuda.runtime.memcpyDeviceToHost,
                stream.ptr,
            )
        stream.synchronize()

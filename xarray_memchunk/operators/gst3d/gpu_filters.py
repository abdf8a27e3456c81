"""GST3D's structure tensor on a GPU: SciPy's 1-D correlations as CUDA kernels.

Every pass of the CPU kernel (:mod:`.fused`) is one launch of one CUDA kernel here, with the
same arithmetic, so a CuPy block's tensor is bit-identical to the one ``scipy.ndimage``
computes from the same input:

- a pass is :func:`scipy.ndimage.correlate1d`'s: values read in double precision, weights in
  double, the centre tap first and then pairs ``(left + right) * w`` from the outermost in
  (``(left - right) * w`` for an antisymmetric kernel), each product and sum rounded on its
  own (``__dmul_rn`` / ``__dadd_rn``: the compiler may not fuse them into one FMA), the
  result rounded to the input's precision, ``reflect`` boundaries repeated as often as a
  short axis needs;
- the passes run in SciPy's order, each gradient's three passes (Gaussian: axes 0, 1, 2; d2geo:
  its derivative first, then the smoothing along the other two in increasing order), then each
  product's three;
- the first smoothing pass of each tensor component reads the two gradients and rounds their
  product to the input's precision, as ``np.multiply`` does, so the product is never stored.

Every tap is multiplied, zero weights included, so a NaN reaches exactly the voxels within the
halo, as on the CPU. Each thread computes one output voxel of one pass; a warp reads 32
neighbouring voxels of the contiguous axis, so every tap of every axis is a coalesced read, and
the taps' overlap is served from the caches.

Device memory, in padded blocks of the compute dtype: the input, one smoothed copy shared by
two gradients (Gaussian only), the three gradients and a pass's two buffers while gradients
are made; then the gradients still needed, one scratch buffer and the components made so far
(at most 9 blocks, input included, while the last two components are smoothed).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .workspace import correlation_weights, symmetry

__all__ = ["gpu_structure_tensor"]

_SOURCE = r"""
typedef {T} T;
#define MULTIPLY_RN {MULTIPLY}

__device__ __forceinline__ long long reflect_index(long long q, long long n) {
    if (q >= 0 && q < n) return q;
    long long period = 2 * n;
    q %= period;
    if (q < 0) q += period;
    if (q >= n) q = period - 1 - q;
    return q;
}

struct Line {
    long long base, stride, n, p;
};

__device__ __forceinline__ Line line_of(long long i0, long long i1, long long i2,
                                        long long n0, long long n1, long long n2, int axis) {
    Line line;
    long long index = (i0 * n1 + i1) * n2 + i2;
    if (axis == 0) { line.n = n0; line.p = i0; line.stride = n1 * n2; }
    else if (axis == 1) { line.n = n1; line.p = i1; line.stride = n2; }
    else { line.n = n2; line.p = i2; line.stride = 1; }
    line.base = index - line.p * line.stride;
    return line;
}

template <bool PRODUCT>
__device__ __forceinline__ double tap_value(const T* __restrict__ a, const T* __restrict__ b,
                                            long long at) {
    if (PRODUCT) return (double)MULTIPLY_RN(a[at], b[at]);
    return (double)a[at];
}

template <bool PRODUCT>
__device__ __forceinline__ void correlate_line(
        const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
        const double* __restrict__ w, int size, int sym,
        long long n0, long long n1, long long n2, int axis) {
    long long i2 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i2 >= n2) return;
    int half = size / 2;
    for (long long i0 = blockIdx.z; i0 < n0; i0 += gridDim.z) {
        for (long long i1 = blockIdx.y; i1 < n1; i1 += gridDim.y) {
            Line L = line_of(i0, i1, i2, n0, n1, n2, axis);
            double acc;
            if (sym != 0) {
                acc = __dmul_rn(tap_value<PRODUCT>(a, b, L.base + L.p * L.stride), w[half]);
                for (int t = 0; t < half; ++t) {
                    double left = tap_value<PRODUCT>(
                        a, b, L.base + reflect_index(L.p + t - half, L.n) * L.stride);
                    double right = tap_value<PRODUCT>(
                        a, b, L.base + reflect_index(L.p + half - t, L.n) * L.stride);
                    double pair = sym > 0 ? __dadd_rn(left, right) : __dsub_rn(left, right);
                    acc = __dadd_rn(acc, __dmul_rn(pair, w[t]));
                }
            } else {
                acc = __dmul_rn(tap_value<PRODUCT>(
                    a, b, L.base + reflect_index(L.p + size - 1 - half, L.n) * L.stride),
                    w[size - 1]);
                for (int t = 0; t < size - 1; ++t) {
                    double v = tap_value<PRODUCT>(
                        a, b, L.base + reflect_index(L.p + t - half, L.n) * L.stride);
                    acc = __dadd_rn(acc, __dmul_rn(v, w[t]));
                }
            }
            out[L.base + L.p * L.stride] = (T)acc;
        }
    }
}

extern "C" __global__ void memchunk_correlate(
        const T* __restrict__ src, T* __restrict__ out, const double* __restrict__ w,
        int size, int sym, long long n0, long long n1, long long n2, int axis) {
    correlate_line<false>(src, src, out, w, size, sym, n0, n1, n2, axis);
}

extern "C" __global__ void memchunk_correlate_product(
        const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
        const double* __restrict__ w, int size, int sym,
        long long n0, long long n1, long long n2, int axis) {
    correlate_line<true>(a, b, out, w, size, sym, n0, n1, n2, axis);
}
"""

#: Threads per CUDA block, along the contiguous axis.
THREADS = 128
#: CUDA's limit on a grid's second and third dimensions.
_GRID_LIMIT = 65535


@functools.cache
def _module(dtype_name: str) -> Any:
    """The CUDA passes compiled for ``float32`` or ``float64`` blocks (NVRTC, once per dtype)."""
    import cupy

    single = dtype_name == "float32"
    source = _SOURCE.replace("{T}", "float" if single else "double")
    source = source.replace("{MULTIPLY}", "__fmul_rn" if single else "__dmul_rn")
    return cupy.RawModule(code=source, options=("--std=c++14",))


class _Passes:
    """Launches of the correlation kernels on blocks of one shape and dtype."""

    def __init__(self, shape: tuple[int, ...], dtype: DTypeLike) -> None:
        import cupy

        self.cupy = cupy
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        module = _module(self.dtype.name)
        self.correlate = module.get_function("memchunk_correlate")
        self.correlate_product = module.get_function("memchunk_correlate_product")
        n0, n1, n2 = self.shape
        self.grid = ((n2 + THREADS - 1) // THREADS, min(n1, _GRID_LIMIT), min(n0, _GRID_LIMIT))
        self.sizes = (np.int64(n0), np.int64(n1), np.int64(n2))

    def weights(self, w: np.ndarray) -> tuple[Any, np.int32, np.int32]:
        """Device weights, their length and SciPy's symmetry code."""
        return (
            self.cupy.asarray(w, dtype=np.float64),
            np.int32(w.shape[0]),
            np.int32(symmetry(w)),
        )

    def run(self, src: Any, axis: int, w: tuple, out: Any | None = None) -> Any:
        """``src`` correlated with ``w`` along ``axis``, into ``out`` (a new array if None)."""
        out = self.cupy.empty(self.shape, self.dtype) if out is None else out
        args = (src, out, *w, *self.sizes, np.int32(axis))
        self.correlate(self.grid, (THREADS, 1, 1), args)
        return out

    def run_product(self, a: Any, b: Any, axis: int, w: tuple, out: Any) -> Any:
        """``a * b`` (rounded as ``np.multiply`` rounds) correlated along ``axis`` into ``out``."""
        args = (a, b, out, *w, *self.sizes, np.int32(axis))
        self.correlate_product(self.grid, (THREADS, 1, 1), args)
        return out


def _gradients(x: Any, passes: _Passes, kernel: str, wd: tuple, ws: tuple) -> list[Any]:
    """The three gradients, each pass in the order the CPU kernel runs it.

    d2geo: the derivative along the gradient's axis, then the smoothing along the other two in
    increasing order. Gaussian (:func:`scipy.ndimage.gaussian_filter`): axes 0, 1, 2 in turn,
    so the y and z gradients share their first pass, run once.
    """

    def chain(current: Any, steps: list[tuple[int, tuple]]) -> Any:
        for axis, w in steps:
            current = passes.run(current, axis, w)
        return current

    if kernel == "d2geo":
        return [chain(x, [(a, wd)] + [(o, ws) for o in range(3) if o != a]) for a in range(3)]
    smoothed = passes.run(x, 0, ws)
    return [
        chain(x, [(0, wd), (1, ws), (2, ws)]),
        chain(smoothed, [(1, wd), (2, ws)]),
        chain(smoothed, [(1, ws), (2, wd)]),
    ]


def gpu_structure_tensor(
    x: Any, kernel: str, sigma: float, rho: float, truncate: float, dtype: DTypeLike
) -> list[Any]:
    """The six smoothed tensor components of a CuPy block, flat, as :mod:`.fused` computes them.

    Parameters
    ----------
    x
        A 3-D CuPy block (inline, crossline, sample).
    kernel, sigma, rho, truncate
        As :func:`.kernels.gst3d_block` takes them.
    dtype
        The compute dtype (float32 or float64).

    Returns
    -------
    list of cupy.ndarray
        ``(xx, yy, zz, xy, xz, yz)``, each flat, of ``x.size`` elements in ``dtype``.
    """
    import cupy

    x = cupy.ascontiguousarray(x, dtype=dtype)
    passes = _Passes(x.shape, x.dtype)
    wd, ws, wr = (passes.weights(w) for w in correlation_weights(kernel, sigma, rho, truncate))
    gx, gy, gz = _gradients(x, passes, kernel, wd, ws)
    del x  # a copy made above (another dtype or layout) is not needed any more
    shape, dtype = passes.shape, passes.dtype
    scratch = cupy.empty(shape, dtype)
    gradients = [gx, gy, gz]
    del gx, gy, gz
    tensor = {}
    for a in range(3):  # xx, xy, xz; yy, yz; zz
        for b in range(a, 3):
            component = cupy.empty(shape, dtype)
            passes.run_product(gradients[a], gradients[b], 0, wr, component)
            passes.run(component, 1, wr, scratch)
            passes.run(scratch, 2, wr, component)
            tensor["xyz"[a] + "xyz"[b]] = component
        gradients[a] = None  # its last product is made: freed
    del scratch
    return [tensor[k].reshape(-1) for k in ("xx", "yy", "zz", "xy", "xz", "yz")]

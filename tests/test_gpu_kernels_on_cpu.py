"""The CUDA sources of GST3D's GPU path, compiled for the CPU: SciPy's arithmetic, bit for bit.

CI has no GPU, so ``test_gpu.py`` is skipped there. These tests compile the same CUDA source
text with the host's C++ compiler (``__device__`` and the launch variables defined away, the
rounding intrinsics as volatile double operations, ``-ffp-contract=off`` as CUDA's
``__dmul_rn``/``__dadd_rn`` forbid fusing) and run each kernel over its whole grid through a
stand-in ``cupy`` module, so the library's :func:`gpu_structure_tensor` drives them as it
drives CUDA. What only a GPU shows (NVRTC, the device's own ``acos``) is ``test_gpu.py``'s.
"""

import ctypes
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from xarray_memchunk.operators.gst3d import gpu, gpu_filters
from xarray_memchunk.operators.gst3d.fused import gst3d, structure_tensor

COMPILER = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs a C++ compiler")

DEVICE_STUBS = r"""
#include <cmath>
using std::fabs;
struct Dim3 { long long x, y, z; };
static Dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__ __restrict
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
"""

PASS_LAUNCHER = r"""
extern "C" void launch(int product, long long gx, long long gy, long long gz, long long bx,
                       const T* a, const T* b, T* out, const double* w, int size, int sym,
                       long long n0, long long n1, long long n2, int axis) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, 1, 1};
    for (long long z = 0; z < gz; ++z) for (long long y = 0; y < gy; ++y)
    for (long long x = 0; x < gx; ++x) for (long long t = 0; t < bx; ++t) {
        blockIdx = {x, y, z};
        threadIdx = {t, 0, 0};
        if (product) memchunk_correlate_product(a, b, out, w, size, sym, n0, n1, n2, axis);
        else memchunk_correlate(a, out, w, size, sym, n0, n1, n2, axis);
    }
}
"""

EIGEN_LAUNCHER = r"""
extern "C" void attribute(const float* t, long long n, int code, float* out) {
    for (long long i = 0; i < n; ++i)
        out[i] = (float)memchunk_gst3d(t[i], t[n + i], t[2 * n + i], t[3 * n + i],
                                       t[4 * n + i], t[5 * n + i], code);
}
"""


def _compile(source: str, path) -> ctypes.CDLL:
    (path.with_suffix(".cpp")).write_text(source)
    command = [COMPILER, "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-o", str(path)]
    subprocess.run([*command, str(path.with_suffix(".cpp"))], check=True)
    return ctypes.CDLL(str(path))


def _pointer(array: np.ndarray) -> ctypes.c_void_p:
    assert array.flags.c_contiguous
    return array.ctypes.data_as(ctypes.c_void_p)


class _Kernel:
    """A compiled pass, called as ``cupy.RawKernel`` is: ``kernel(grid, block, args)``."""

    def __init__(self, library: ctypes.CDLL, product: bool) -> None:
        self.library, self.product = library, product

    def __call__(self, grid, block, args) -> None:
        if self.product:
            a, b, out, w, size, sym, n0, n1, n2, axis = args
        else:
            a, out, w, size, sym, n0, n1, n2, axis = args
            b = a
        longs = [ctypes.c_longlong(int(v)) for v in (*grid, block[0])]
        self.library.launch(
            ctypes.c_int(int(self.product)),
            *longs,
            *(_pointer(v) for v in (a, b, out, w)),
            ctypes.c_int(int(size)),
            ctypes.c_int(int(sym)),
            *(ctypes.c_longlong(int(v)) for v in (n0, n1, n2)),
            ctypes.c_int(int(axis)),
        )


@pytest.fixture
def cpu_cupy(tmp_path, monkeypatch):
    """A ``cupy`` whose arrays are NumPy's and whose ``RawModule`` compiles for the CPU."""
    libraries = {}

    class RawModule:
        def __init__(self, code: str, options=()) -> None:
            if code not in libraries:
                path = tmp_path / f"passes{len(libraries)}.so"
                libraries[code] = _compile(DEVICE_STUBS + code + PASS_LAUNCHER, path)
            self.library = libraries[code]

        def get_function(self, name: str) -> _Kernel:
            return _Kernel(self.library, product=name == "memchunk_correlate_product")

    module = types.ModuleType("cupy")
    module.empty = np.empty
    module.asarray = np.asarray
    module.ascontiguousarray = np.ascontiguousarray
    module.RawModule = RawModule
    monkeypatch.setitem(sys.modules, "cupy", module)
    gpu_filters._module.cache_clear()
    yield
    gpu_filters._module.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
@pytest.mark.parametrize("shape", [(23, 17, 30), (5, 9, 4), (40, 3, 33)])
def test_cuda_passes_compute_scipys_tensor_bit_for_bit(cpu_cupy, monkeypatch, kernel, dtype, shape):
    # axes shorter than the kernels (reflected more than once), a NaN, and grids smaller than
    # the block, so each thread loops over several lines
    monkeypatch.setattr(gpu_filters, "THREADS", 8)
    monkeypatch.setattr(gpu_filters, "_GRID_LIMIT", 3)
    block = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    block[2, 1, 3] = np.nan
    options = {"sigma": 1.0, "rho": 2.0, "truncate": 3.0}
    components = gpu_filters.gpu_structure_tensor(block, kernel, **options, dtype=block.dtype)
    got = np.stack([c.reshape(shape) for c in components])
    np.testing.assert_array_equal(got, structure_tensor(block, kernel=kernel, **options))


def test_cuda_eigen_kernel_gives_nan_and_zero_tensors_as_the_cpu_does(tmp_path):
    library = _compile(DEVICE_STUBS + gpu._PREAMBLE + EIGEN_LAUNCHER, tmp_path / "eigen.so")
    block = np.random.default_rng(0).standard_normal((30, 24, 26)).astype(np.float32)
    block[15, 12, :] = np.nan
    block[:12] = 0.0  # zero tensors in the 3 planes beyond the halo (9) of the first data
    tensor = np.ascontiguousarray(structure_tensor(block), dtype=np.float32)
    for name, code in gpu.ATTRIBUTE_CODES.items():
        out = np.empty(block.size, np.float32)
        library.attribute(_pointer(tensor), ctypes.c_longlong(block.size), code, _pointer(out))
        expected = gst3d(block, attribute=name).reshape(-1)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
        assert np.isnan(expected).sum() > 1000
        difference = np.abs(out - expected)
        if name == "azimuth":
            difference = np.minimum(difference, 360.0 - difference)
        assert np.nanmax(difference) < 1e-3, name
        zero = out.reshape(block.shape)[:3]
        if name in ("planarity", "linearity"):  # l1 = 0: 0, not NaN
            np.testing.assert_array_equal(zero, 0.0)
        else:  # degenerate: vertical, dip 0 and azimuth +0, as on the CPU
            np.testing.assert_array_equal(np.signbit(zero), False)
            np.testing.assert_array_equal(zero, 0.0)

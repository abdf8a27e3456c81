"""The fused (Numba) GST3D kernel against SciPy's filters and the NumPy eigen-solver."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from harness.gst3d_reference import ATTRIBUTES, reference, reference_tensor
from numba import njit
from scipy import ndimage

from xarray_memchunk.operators.gst3d import fused, workspace
from xarray_memchunk.operators.gst3d.kernels import gst3d_block, halo_depth


def difference(attribute, got, expected):
    diff = np.abs(got - expected)
    if attribute == "azimuth":
        diff = np.minimum(diff, 360.0 - diff)
    return diff


def smoothed_noise(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return ndimage.gaussian_filter(rng.standard_normal(shape), 1.0).astype(dtype)


# --- weights and boundaries --------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.4, 1.0, 1.7, 2.0, 3.3])
@pytest.mark.parametrize("truncate", [1.0, 3.0, 4.0])
@pytest.mark.parametrize("order", [0, 1])
def test_weights_are_scipys(sigma, truncate, order):
    weights = fused.gaussian_weights(sigma, order, truncate)
    radius = int(truncate * sigma + 0.5)
    assert weights.shape == (2 * radius + 1,)
    # what gaussian_filter1d correlates with: the response to a delta, reversed
    delta = np.zeros(2 * radius + 1)
    delta[radius] = 1.0
    response = ndimage.gaussian_filter1d(
        delta, sigma, order=order, truncate=truncate, mode="constant"
    )
    np.testing.assert_array_equal(weights, response[::-1])
    # SciPy's test: a single weight counts as symmetric
    assert fused.symmetry(weights) == (1 if order == 0 or radius == 0 else -1)
    private = getattr(getattr(ndimage, "_filters", None), "_gaussian_kernel1d", None)
    if private is not None:
        np.testing.assert_array_equal(weights, private(sigma, order, radius)[::-1])


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("sym", [1, -1, 0])
def test_passes_match_correlate1d_on_lines_shorter_than_the_kernel(n, sym):
    # radius 6 on lines of 1..5: reflect wraps the line several times
    rng = np.random.default_rng(n)
    w = rng.standard_normal(13)
    if sym:
        w = (w + sym * w[::-1]) / 2
    plane = rng.standard_normal((n, n + 2)).astype(np.float32)
    expected_rows = ndimage.correlate1d(plane, w, axis=0, mode="reflect")
    expected_last = ndimage.correlate1d(plane, w, axis=1, mode="reflect")
    got = np.empty_like(plane)
    idx = np.empty(13, np.int64)
    acc = np.empty(fused.ACCUMULATOR)
    fused._pass_rows(plane, w, fused.symmetry(w), got, idx, acc)
    np.testing.assert_array_equal(got, expected_rows)
    ext = np.empty(plane.shape[1] + 12)
    fused._pass_last(plane, w, fused.symmetry(w), got, ext, acc)
    np.testing.assert_array_equal(got, expected_last)


# --- the fused kernel against the reference ----------------------------------------------------

SHAPES = [(24, 20, 18), (5, 7, 9), (40, 9, 13), (3, 30, 4), (2, 3, 1), (1, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_tensor_is_bit_identical_to_scipys(shape, dtype, kernel):
    x = smoothed_noise(shape, dtype)
    got = fused.structure_tensor(x, kernel=kernel)
    assert got.dtype == x.dtype
    for component, expected in zip(got, reference_tensor(x, kernel), strict=True):
        np.testing.assert_array_equal(component, expected)


def test_tensor_with_other_parameters_and_a_nan():
    x = smoothed_noise((26, 21, 17), "float32", seed=1)
    x[3, 4, 5] = np.nan
    for sigma, rho, truncate in (
        (0.7, 1.3, 4.0),
        (1.5, 1.0, 2.0),
        (2.0, 3.0, 1.0),
        (1.0, 0.3, 1.0),
    ):
        got = fused.structure_tensor(x, sigma=sigma, rho=rho, truncate=truncate)
        for component, expected in zip(
            got, reference_tensor(x, "gaussian", sigma, rho, truncate), strict=True
        ):
            np.testing.assert_array_equal(component, expected)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
@pytest.mark.parametrize("attribute", ATTRIBUTES)
def test_attributes_match_the_reference(shape, dtype, kernel, attribute):
    x = smoothed_noise(shape, dtype)
    expected = reference(x, attribute, kernel)
    got = gst3d_block(x, attribute=attribute, kernel=kernel, out_dtype="float64")
    assert got.shape == x.shape and got.dtype == np.float64
    diff = difference(attribute, got, expected)
    # same tensor; the solve differs by the ulps of acos, cos and atan2
    bound = 1e-6 if attribute in ("dip", "azimuth") else 1e-9
    assert np.quantile(diff, 0.99) <= bound / 10
    assert diff.max() <= bound


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_dip_on_a_larger_block(dtype, kernel):
    # the brief's bar: float32 dips within 1e-3 degrees at the 99th percentile; much tighter
    x = smoothed_noise((48, 40, 36), dtype, seed=5)
    diff = np.abs(gst3d_block(x, kernel=kernel, out_dtype="float64") - reference(x, "dip", kernel))
    assert np.quantile(diff, 0.99) < 1e-3
    assert diff.max() < (1e-6 if dtype == "float32" else 1e-8)


def test_other_parameters_and_float32_output():
    x = smoothed_noise((30, 26, 22), "float32", seed=2)
    for sigma, rho, truncate in ((0.7, 1.3, 4.0), (1.5, 1.0, 2.0), (2.0, 3.0, 1.0)):
        expected = reference(x, "dip", "gaussian", sigma, rho, truncate)
        got = gst3d_block(x, sigma=sigma, rho=rho, truncate=truncate)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected.astype(np.float32), rtol=0, atol=1e-4)


@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_reaches_exactly_the_halo_for_every_attribute(kernel, dtype):
    x = smoothed_noise((30, 28, 26), dtype, seed=3)
    x[15, 14, 13] = np.nan
    x[2, 27, 0] = np.nan  # near a corner: the halo is reflected back into the block
    depth = halo_depth(kernel, 1.0, 2.0, 3.0)
    expected_nan = np.isnan(reference(x, "dip", kernel))
    near = np.zeros(x.shape, bool)
    for i, j, k in ((15, 14, 13), (2, 27, 0)):
        near[
            max(0, i - depth) : i + depth + 1,
            max(0, j - depth) : j + depth + 1,
            max(0, k - depth) : k + depth + 1,
        ] = True
    np.testing.assert_array_equal(expected_nan, near)
    for attribute in ATTRIBUTES:
        got = gst3d_block(x, attribute=attribute, kernel=kernel, out_dtype="float64")
        np.testing.assert_array_equal(np.isnan(got), expected_nan)  # planarity too
        diff = difference(attribute, got, reference(x, attribute, kernel))
        assert diff[~expected_nan].max() <= 1e-6


@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_all_nan_zero_and_constant_blocks(kernel):
    for attribute in ATTRIBUTES:
        nan = gst3d_block(np.full((6, 5, 4), np.nan, "float32"), attribute=attribute, kernel=kernel)
        assert np.isnan(nan).all()
        for value in (0.0, 3.5):
            flat = np.full((7, 6, 5), value, "float32")
            got = gst3d_block(flat, attribute=attribute, kernel=kernel, out_dtype="float64")
            # no gradient: the vertical, dip and azimuth 0, planarity and linearity 0
            np.testing.assert_array_equal(got, reference(flat, attribute, kernel))
            np.testing.assert_array_equal(got, 0.0)


def test_amplitude_scale_does_not_matter():
    x = smoothed_noise((20, 18, 16), "float64", seed=4)
    base = gst3d_block(x, out_dtype="float64")
    for scale in (1e-150, 1e-8, 1e8, 1e150):
        np.testing.assert_allclose(gst3d_block(x * scale, out_dtype="float64"), base, atol=1e-9)


def test_layouts_and_dtypes():
    x = smoothed_noise((12, 10, 14), "float32")
    base = gst3d_block(x)
    # a strided view is copied to C order first
    view = np.ascontiguousarray(np.transpose(x, (2, 1, 0))).transpose(2, 1, 0)
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(gst3d_block(view), base)
    # integers are filtered in float32, as SciPy filters them into a float32 output
    ints = (x * 1000).astype(np.int16)
    np.testing.assert_allclose(
        gst3d_block(ints, out_dtype="float64"), reference(ints, "dip"), rtol=0, atol=1e-6
    )
    half = gst3d_block(x, out_dtype="float16")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, base.astype(np.float16))
    assert gst3d_block(np.empty((0, 4, 5), "float32")).shape == (0, 4, 5)
    stack = np.stack([x, -x, 2 * x])
    out = gst3d_block(stack)
    for i in range(3):
        np.testing.assert_array_equal(out[i], gst3d_block(stack[i]))


def test_batch_size_does_not_change_the_result(monkeypatch):
    x = smoothed_noise((64, 12, 10), "float32", seed=6)
    assert fused.batch_size(64, "gaussian", 13) == 2
    assert fused.batch_size(200, "gaussian", 13) == 4
    assert fused.batch_size(20, "gaussian", 13) == 1
    batched = {}
    for batches in ((4, 2, 1), (2, 1), (1,)):
        monkeypatch.setattr(workspace, "BATCHES", batches)
        for attribute in ATTRIBUTES:
            out = fused.gst3d(x, attribute=attribute)
            if attribute in batched:
                np.testing.assert_array_equal(out, batched[attribute])
            batched[attribute] = out


def test_workspace_stays_small():
    import tracemalloc

    x = smoothed_noise((64, 48, 40), "float32")
    fused.gst3d(x[:4, :4, :4])  # compiled before measuring
    tracemalloc.start()
    out = fused.gst3d(x)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    planes = fused.workspace_planes(64, "gaussian", 13, fused.batch_size(64, "gaussian", 13))
    assert planes <= 2 * 64
    assert peak <= out.nbytes + planes * 48 * 40 * 4 + 2**20
    assert peak / x.size < 13  # bytes per voxel, besides the input


def test_threads_run_blocks_at_once():
    blocks = [smoothed_noise((20, 18, 16), "float32", seed=s) for s in range(4)]
    alone = [gst3d_block(b) for b in blocks]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(gst3d_block, blocks))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)


def test_unknown_kernel_or_attribute():
    x = np.zeros((3, 3, 3), "float32")
    with pytest.raises(ValueError, match="kernel"):
        fused.gst3d(x, kernel="sobel")
    with pytest.raises(ValueError, match="attribute"):
        fused.gst3d(x, attribute="curvature")


# --- FDLIBM's functions, vectorisable ------------------------------------------------------------


@njit(error_model="numpy")  # inlined: the caller's error model applies (IEEE division)
def _apply(name, x, y, out):
    for i in range(x.shape[0]):
        if name == 0:
            out[i] = fused._acos(x[i])
        elif name == 1:
            out[i] = fused._cos(x[i])
        else:
            out[i] = fused._atan2(x[i], y[i])


def ulps(got, expected):
    spacing = np.spacing(np.maximum(np.abs(expected), np.finfo(np.float64).tiny))
    return np.abs(got - expected) / spacing


def test_acos_cos_atan2_are_within_an_ulp():
    rng = np.random.default_rng(7)
    n = 400_000
    edges = np.array([-1.0, -0.5, -0.0, 0.0, 0.5, 1.0, np.nextafter(1.0, 0), 1e-300, -1e-17])
    x = np.concatenate([rng.uniform(-1, 1, n), 1 - rng.uniform(0, 1e-6, 1000), edges])
    out = np.empty_like(x)
    _apply(0, x, x, out)
    assert ulps(out, np.arccos(x)).max() <= 1
    assert np.isnan(fused_acos(np.nan))
    t = np.concatenate([rng.uniform(0, np.pi, n), [0.0, np.pi / 4, np.pi / 2, np.pi, 2.0944]])
    out = np.empty_like(t)
    _apply(1, t, t, out)
    # near pi/2 cos is tiny: an absolute error of an ulp of 1 is what matters there
    expected = np.cos(t)
    assert (np.abs(out - expected) <= np.maximum(np.spacing(np.abs(expected)), 1e-17)).all()
    assert ulps(out, expected)[np.abs(expected) > 1e-3].max() <= 1
    y = np.concatenate([rng.uniform(-1, 1, n), [0.0, -0.0, 0.0, -0.0, 1.0, -1.0, 1e-300]])
    x2 = np.concatenate([rng.uniform(-1, 1, n), [0.0, 0.0, -0.0, -0.0, 0.0, -0.0, -1e-300]])
    out = np.empty_like(y)
    _apply(2, y, x2, out)
    expected = np.arctan2(y, x2)
    assert ulps(out, expected).max() <= 1
    np.testing.assert_array_equal(np.signbit(out), np.signbit(expected))


def fused_acos(value):
    out = np.empty(1)
    _apply(0, np.array([value]), np.array([value]), out)
    return out[0]


def test_planning_never_imports_numba():
    """Importing Numba costs a process ~53 MB: only a process that runs the kernel pays it."""
    code = (
        "import sys, xarray_memchunk as xm\n"
        "from xarray_memchunk.datasets import synthetic_seismic\n"
        "ds = synthetic_seismic((40, 40, 40), chunks=20)\n"
        "ds.memchunk.plan('gst3d', memory_limit='1GB')\n"
        "assert 'numba' not in sys.modules\n"
        "ds.isel(inline=slice(0, 20)).load().memchunk.apply('gst3d')\n"
        "assert 'numba' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)

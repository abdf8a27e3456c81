"""On a CUDA GPU: CuPy-backed data plans against device memory and matches the CPU result.

Skipped where CuPy or a GPU is missing (``pip install -e ".[gpu]"`` on a CUDA machine).

Tolerances. GST3D: the filters are SciPy's arithmetic on both devices, so the tensor
components are bit-identical (tested). The eigen-analysis is float64 on both with the same
formulas, but CUDA's ``acos`` and ``cos`` may differ from the CPU's FDLIBM ones by an ulp, and
NVRTC may fuse a multiply and an add into one FMA (``--fmad`` is on by default). Such
a difference moves the principal direction by about 1e-16 / (l1 - l2) radians: nothing
wherever the structure is planar, and unbounded where the two largest eigenvalues meet (no
defined direction). So the bound is on the 99.9th percentile of dip and azimuth differences
(1e-2 degrees) plus a median bound (1e-4 degrees), and planarity / linearity (which do not
divide by l1 - l2) are bounded everywhere (1e-4).
"""

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic

cupy = pytest.importorskip("cupy")
try:
    HAVE_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except cupy.cuda.runtime.CUDARuntimeError:
    HAVE_GPU = False
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def few_threads():
    """Four threads share the GPU. With one per CPU (16 here), CuPy compiles each new kernel
    in every thread at once on first use: a first call took over 45 s."""
    with dask.config.set(num_workers=4):
        yield


def to_gpu(da_cpu: xr.DataArray) -> xr.DataArray:
    """The same lazy array with every block copied to the GPU."""
    return da_cpu.copy(data=da_cpu.data.map_blocks(cupy.asarray))


@pytest.fixture
def fields():
    ds = synthetic_climate(n_time=730, n_lat=90, n_lon=180)
    cpu = ds["tas"].chunk({"time": 73})
    return cpu, to_gpu(cpu)


@pytest.mark.parametrize("op", ["mean", "std", "max", "median"])
def test_reductions_on_cupy_match_numpy(fields, op):
    cpu, gpu = fields
    plan = gpu.memchunk.plan(op, dim="T")
    assert plan.budget.device == "gpu"
    result = gpu.memchunk.apply(op, dim="T").compute()
    assert isinstance(result.data, cupy.ndarray)
    expected = cpu.memchunk.apply(op, dim="T").compute()
    np.testing.assert_allclose(cupy.asnumpy(result.data), expected.values, rtol=2e-5)


@pytest.mark.parametrize("method", ["linear", "nearest"])
def test_quantile_on_cupy_matches_numpy_with_and_without_nan(fields, method):
    cpu, _ = fields
    holed = cpu.where(cpu.lat < 80)  # all-NaN series in a few slabs
    for data in (cpu, holed):
        gpu = to_gpu(data)
        result = gpu.memchunk.apply("quantile", q=[0.1, 0.9], dim="T", method=method).compute()
        assert isinstance(result.data, cupy.ndarray)
        expected = data.memchunk.apply("quantile", q=[0.1, 0.9], dim="T", method=method)
        np.testing.assert_allclose(
            cupy.asnumpy(result.data), expected.values, rtol=1e-6, equal_nan=True
        )


def seismic(n=96, chunks=48):
    volume = synthetic_seismic((n, n, n))["amplitude"].chunk(chunks)
    return volume, to_gpu(volume)


@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
@pytest.mark.parametrize("attribute", ["dip", "azimuth", "planarity", "linearity"])
def test_gst3d_on_cupy_matches_the_cpu(kernel, attribute):
    cpu, gpu = seismic()
    expected = cpu.memchunk.apply("gst3d", attribute=attribute, kernel=kernel).values
    result = gpu.memchunk.apply("gst3d", attribute=attribute, kernel=kernel).compute()
    assert isinstance(result.data, cupy.ndarray)
    diff = np.abs(cupy.asnumpy(result.data) - expected)
    if attribute == "azimuth":  # 0 and 360 degrees are one direction
        diff = np.minimum(diff, 360.0 - diff)
    if attribute in ("dip", "azimuth"):
        assert np.median(diff) < 1e-4
        assert np.quantile(diff, 0.999) < 1e-2
    else:
        assert diff.max() < 1e-4


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_gst3d_tensor_on_cupy_is_bit_identical_to_the_cpus(kernel, dtype):
    from xarray_memchunk.operators.gst3d.fused import structure_tensor
    from xarray_memchunk.operators.gst3d.gpu_filters import gpu_structure_tensor

    block = np.random.default_rng(3).standard_normal((40, 7, 33)).astype(dtype)
    block[20, 3, 5] = np.nan
    options = {"sigma": 1.0, "rho": 2.0, "truncate": 3.0}
    components = gpu_structure_tensor(cupy.asarray(block), kernel, **options, dtype=dtype)
    got = np.stack([cupy.asnumpy(c).reshape(block.shape) for c in components])
    expected = structure_tensor(block, kernel=kernel, **options)
    np.testing.assert_array_equal(got, expected)


def test_gst3d_on_cupy_keeps_nan_where_the_cpu_does():
    cpu, _ = seismic(64, 32)
    holed = cpu.where((cpu.inline != 20) | (cpu.crossline != 40))
    expected = holed.memchunk.apply("gst3d").values
    result = cupy.asnumpy(to_gpu(holed).memchunk.apply("gst3d").compute().data)
    np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))


def test_svd_on_cupy_matches_the_cpu():
    rng = np.random.default_rng(0)
    modes = rng.standard_normal((2000, 3)) @ rng.standard_normal((3, 400)) * [[30.0]]
    noisy = (modes + rng.standard_normal((2000, 400))).astype("float32").reshape(2000, 20, 20)
    cpu = xr.DataArray(noisy, dims=("time", "y", "x")).chunk({"time": 250})
    gpu = to_gpu(cpu)
    expected = cpu.memchunk.apply("svd", sample_dims="time", method="exact")
    exact = gpu.memchunk.apply("svd", sample_dims="time", method="exact").compute()
    assert isinstance(exact.S.data, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(exact.S.data), expected.S.values, rtol=1e-4)
    compressed = gpu.memchunk.apply("svd", sample_dims="time", method="compressed", k=3)
    leading = cupy.asnumpy(compressed.S.compute().data)
    np.testing.assert_allclose(leading, expected.S.values[:3], rtol=1e-3)


@pytest.mark.parametrize("rows_per_block", [40, 250], ids=lambda r: f"rows{r}")
def test_two_pass_svd_on_cupy_matches_numpy(rows_per_block):
    # 40-row blocks are shorter than n: the tree's pairs take the dense-QR path on the device
    from xarray_memchunk.operators.svd.tsqr import two_pass_svd

    rng = np.random.default_rng(1)
    values = rng.standard_normal((2000, 100))
    values[:, 7] = values[:, 8]  # a nearly zero pivot in R
    blocks = da.from_array(values, chunks=(rows_per_block, 100)).map_blocks(cupy.asarray)
    u, s, vh = dask.compute(*two_pass_svd(blocks))
    assert isinstance(u, cupy.ndarray) and isinstance(s, cupy.ndarray)
    u, s, vh = cupy.asnumpy(u), cupy.asnumpy(s), cupy.asnumpy(vh)
    expected = np.linalg.svd(values, compute_uv=False)
    np.testing.assert_allclose(s, expected, atol=1e-12 * expected[0])
    np.testing.assert_allclose((u * s) @ vh, values, atol=1e-10)


def test_device_peak_sees_an_allocation():
    from xarray_memchunk.models.profiling import measure_device_peak

    def allocate(nbytes):
        a = cupy.ones(nbytes // 4, dtype="float32")
        b = a * 2  # a second array of the same size at once
        return float(b[0])

    peak, _, method = measure_device_peak(allocate, 100 * 2**20)
    assert method == "cupy-pool"
    assert 200 * 2**20 <= peak <= 210 * 2**20


def test_gpu_calibration_is_saved_and_chosen_for_cupy_data(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    shapes = [{"time": t, "y": 100, "x": 100} for t in (100, 200, 400, 800)]
    fits = xm.calibrate(
        "median", dtypes=("float32",), shapes=shapes, repeats=1, device="gpu", dim="time"
    )
    assert fits["float32"]["fit"]["n_profiles"] == 4
    import json

    document = json.loads((tmp_path / "median-gpu.json").read_text())
    assert document["device"] == "gpu" and document["method"] == "cupy-pool"
    # median holds its block (4 B a value) and more: the slope is at least one block
    assert fits["float32"]["coefficients"]["input_bytes"] >= 1.0
    zeros = xr.DataArray(np.zeros((400, 50, 60), "float32"), dims=("time", "y", "x"))
    gpu = to_gpu(zeros.chunk())
    plan = gpu.memchunk.plan("median", dim="time")
    assert not any("analytic" in n for n in plan.notes)


def test_budget_takes_back_what_cupys_pool_cached():
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = xm.resolve_budget(device="gpu").worker_baseline
    block = cupy.ones(2**30 // 4, dtype="float32")
    held = xm.resolve_budget(device="gpu").worker_baseline
    del block  # freed to the pool, which keeps it: the driver still counts it as allocated
    cached = xm.resolve_budget(device="gpu")
    assert held >= before + 2**30
    assert pool.free_bytes() >= 2**30
    assert abs(cached.worker_baseline - before) < 64 * 2**20
    assert "cached in CuPy's memory pool" in cached.source
    pool.free_all_blocks()


def test_budget_on_a_cluster_reads_the_workers_gpu_and_dask_cuda_limit():
    from distributed import Client, LocalCluster

    class DeviceHostFile(dict):  # what dask-cuda's worker storage exposes
        device_memory_limit = 4 * 2**30

    _, total = cupy.cuda.Device().mem_info
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=3,
            processes=False,
            dashboard_address=":0",
            data=DeviceHostFile,
        ) as cluster,
        Client(cluster),
    ):
        budget = xm.resolve_budget(device="gpu")
    assert budget.device == "gpu" and budget.threads_per_worker == 3
    assert budget.worker_memory == total
    assert budget.worker_baseline >= 4 * 2**30
    assert "device_memory_limit" in budget.explain()


def test_planned_gst3d_on_cupy_stays_within_its_predicted_device_peak():
    n = 256
    rng = da.random.RandomState(0, RandomState=cupy.random.RandomState)
    volume = xr.DataArray(
        rng.random_sample((n, n, n), chunks=(n, n, 64)).astype("float32"),
        dims=("inline", "crossline", "sample"),
    )
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    with dask.config.set(num_workers=2, scheduler="threads"):
        plan = volume.memchunk.plan("gst3d", memory_limit="2GiB")
        dip = volume.memchunk.apply("gst3d", memory_limit="2GiB")
        dip.data.map_blocks(cupy.asnumpy, meta=np.empty((0, 0, 0), "float32")).compute()
    predicted = plan.budget.threads_per_worker * plan.predicted_peak_bytes
    assert pool.total_bytes() <= predicted

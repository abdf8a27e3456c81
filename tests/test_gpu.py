"""On a CUDA GPU: CuPy-backed data plans against device memory and matches the CPU result.

Skipped where CuPy or a GPU is missing (``pip install -e ".[gpu]"`` on a CUDA machine).
"""

import numpy as np
import pytest

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate

cupy = pytest.importorskip("cupy")
try:
    HAVE_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except cupy.cuda.runtime.CUDARuntimeError:
    HAVE_GPU = False
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU"),
]


@pytest.fixture
def fields():
    ds = synthetic_climate(n_time=730, n_lat=90, n_lon=180)
    cpu = ds["tas"].chunk({"time": 73})
    gpu = cpu.copy(data=cpu.data.map_blocks(cupy.asarray))
    return cpu, gpu


@pytest.mark.parametrize("op", ["mean", "std", "max", "median"])
def test_reductions_on_cupy_match_numpy(fields, op):
    cpu, gpu = fields
    plan = gpu.memchunk.plan(op, dim="T")
    assert plan.budget.source.startswith("GPU")
    result = gpu.memchunk.apply(op, dim="T").compute()
    assert isinstance(result.data, cupy.ndarray)
    expected = cpu.memchunk.apply(op, dim="T").compute()
    np.testing.assert_allclose(cupy.asnumpy(result.data), expected.values, rtol=2e-5)


def test_cpu_only_operator_refuses_cupy_data(fields):
    _, gpu = fields
    with pytest.raises(xm.MemchunkError, match="as_numpy"):
        gpu.memchunk.plan("svd", sample_dims="T")

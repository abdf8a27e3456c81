"""Where the data lives decides the budget: CuPy-backed data plans against the GPU's memory.

These tests need no GPU: a stand-in ``cupy`` module reports the device memory, and the data's
device is set by replacing ``device_of``. What runs on a real GPU is in ``test_gpu.py``.
"""

import sys
import types

import dask
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk import api, resolve_budget
from xarray_memchunk.memory_limits import threaded_scheduler_threads

GiB = 2**30


@pytest.fixture
def fake_gpu(monkeypatch):
    """A ``cupy`` whose device 0 has 80 GiB, 10 GiB of it in use; all data counts as on it.

    Its memory pool caches nothing unless a test sets ``pool.free_bytes``.
    """
    device = types.SimpleNamespace(id=0, mem_info=(70 * GiB, 80 * GiB))
    device.pool = types.SimpleNamespace(free_bytes=lambda: 0)
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(Device=lambda: device)
    module.get_default_memory_pool = lambda: device.pool
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setattr(api, "device_of", lambda da: "gpu")
    return device


def test_gpu_budget_is_device_memory_minus_what_is_in_use(fake_gpu):
    budget = resolve_budget(device="gpu")
    threads = threaded_scheduler_threads()  # the threaded scheduler's, sharing the GPU
    assert budget.worker_memory == 80 * GiB and budget.worker_baseline == 10 * GiB
    assert budget.per_task == int((0.8 * 80 * GiB - 10 * GiB) * (1 - 0.1) / threads)
    assert budget.source.startswith("GPU 0 (cupy)")
    assert "device memory" in budget.explain() and "usable fraction" in budget.explain()


def test_gpu_budget_counts_what_cupys_pool_caches_as_free(fake_gpu):
    # 10 GiB allocated on the device, 6 GiB of it cached by this process's pool for reuse
    fake_gpu.pool.free_bytes = lambda: 6 * GiB
    budget = resolve_budget(device="gpu")
    assert budget.worker_baseline == 4 * GiB
    assert "cached in CuPy's memory pool" in budget.source


def test_gpu_budget_config_and_argument_take_precedence(fake_gpu):
    with dask.config.set(
        {"memchunk.device-memory": "16GB", "memchunk.device-memory-fraction": 0.9}
    ):
        configured = resolve_budget(device="gpu")
    assert configured.worker_memory == 16 * 10**9
    # a device described, not read: its baseline is one CUDA context (512 MiB), not the
    # 10 GiB the fake device has in use
    assert configured.worker_baseline == 512 * 2**20
    threads = threaded_scheduler_threads()
    assert configured.per_task == int((0.9 * 16e9 - 512 * 2**20) * (1 - 0.1) / threads)
    given = resolve_budget("4GB", device="gpu")
    assert given.source == "argument" and "CUDA context" in given.explain()


def test_gpu_budget_threads_follow_the_threaded_schedulers_num_workers(fake_gpu):
    with dask.config.set(num_workers=4):
        budget = resolve_budget(device="gpu")
    assert budget.threads_per_worker == 4
    assert budget.per_task == int((0.8 * 80 * GiB - 10 * GiB) * (1 - 0.1) / 4)


def test_gpu_budget_without_a_gpu_says_what_to_pass(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails
    with pytest.raises(xm.BudgetError, match=r"memory_limit=.*memchunk.device-memory"):
        resolve_budget(device="gpu")
    assert resolve_budget("8GB", device="gpu").worker_memory == 8 * 10**9


def test_every_operator_plans_against_the_gpu(fake_gpu):
    field = xr.DataArray(np.zeros((400, 30, 40), "float32"), dims=("time", "y", "x"))
    plan = field.chunk({"time": 50}).memchunk.plan("median", dim="time")
    assert plan.budget.source.startswith("GPU 0")
    volume = xr.DataArray(np.zeros((40, 40, 40), "float32"), dims=("x", "y", "z"))
    for data, op, kwargs in (
        (volume, "gst3d", {"dims": ("x", "y", "z")}),
        (field, "svd", {"sample_dims": "time"}),
    ):
        plan = data.chunk().memchunk.plan(op, **kwargs)
        assert plan.budget.device == "gpu"


def test_mixed_devices_in_one_dataset_is_an_error(monkeypatch):
    monkeypatch.setattr(api, "device_of", lambda da: "gpu" if da.name == "a" else "cpu")
    ds = xr.Dataset({name: ("time", np.zeros(10)) for name in "ab"})
    with pytest.raises(xm.MemchunkError, match="mixes NumPy"):
        ds.memchunk.plan("mean", dim="time")
    with pytest.raises(xm.MemchunkError, match="mixes NumPy"):
        ds.memchunk.budget()


def test_a_gpu_plan_takes_the_fewest_tasks_its_memory_allows(fake_gpu):
    # 8 threads feed one GPU, which runs one task's kernels at a time: more tasks add halo and
    # overhead, no parallelism. On CPUs the same budget is cut for the 8 threads.
    volume = xr.DataArray(np.zeros((256, 256, 256), "float32"), dims=("x", "y", "z")).chunk()
    gst3d = {"dims": ("x", "y", "z")}
    with dask.config.set(num_workers=8):
        on_gpu = volume.memchunk.plan("gst3d", **gst3d)
        budget = on_gpu.budget
    assert budget.device == "gpu" and budget.threads_per_worker == 8
    assert budget.compute_slots == 1 and budget.total_threads == 8
    assert on_gpu.n_chunks == 1
    same_budget_on_cpu = xm.Budget(**{**vars(budget), "device": "cpu"})
    on_cpu = volume.memchunk.plan("gst3d", memory_limit=same_budget_on_cpu, **gst3d)
    assert on_cpu.n_chunks >= 8

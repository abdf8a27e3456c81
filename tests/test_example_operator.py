"""The example operator (``tests/example_operator.py``): registered, planned, applied, checked."""

import numpy as np
import pytest
import xarray as xr
from example_operator import MovingAverage
from scipy.ndimage import uniform_filter1d

import xarray_memchunk as xm
from xarray_memchunk.planning.candidates import padded_extent


@pytest.fixture(scope="module")
def moving_average():
    return xm.register_operator(MovingAverage(), overwrite=True)


def test_plan_apply_and_compare_with_numpy(moving_average, threaded):
    values = np.random.default_rng(0).standard_normal(1_000_000).astype("float32")
    da = xr.DataArray(values, dims="x")
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=4_000_000, source="test"
    )
    plan = da.memchunk.plan("example-moving-average", window=5, budget=budget)
    assert plan.fits and plan.halo == {"x": 2} and len(plan.dask_chunks["x"]) >= 3

    # the predicted task peak is the cost's model on the largest padded task
    cost = moving_average.cost(da)
    padded = {"x": np.array([padded_extent(plan.chunks["x"], len(plan.dask_chunks["x"]), 2)])}
    assert plan.predicted_task_bytes == cost.model.peak_bytes(cost.features(padded))[0]

    result = plan.apply()
    expected = uniform_filter1d(values, 5, mode="nearest")
    np.testing.assert_allclose(result.values, expected, rtol=1e-5, atol=1e-6)


def test_wrong_arguments_are_refused_before_anything_runs(moving_average):
    da = xr.DataArray(np.zeros((10, 3)), dims=("x", "y"))
    with pytest.raises(xm.MemchunkError, match="odd window"):
        da.memchunk.plan("example-moving-average", window=4)
    with pytest.raises(xm.DimensionError, match="needs dim 't'"):
        da.memchunk.plan("example-moving-average", dim="t")

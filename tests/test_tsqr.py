"""The two-pass tsqr: exact results, refusals, and plans that hold only n x n factors."""

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.operators.svd.tsqr import held_bytes_per_block, two_pass_svd
from xarray_memchunk.testing import run_watched


def matrix(rows, cols, dtype, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols))
    values[:, 3] = 0.0  # a zero column and two equal ones: R has (nearly) zero pivots
    values[:, 7] = values[:, 8]
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.standard_normal((rows, cols))
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
@pytest.mark.parametrize("rows_per_block", [40, 100, 333, 3000], ids=lambda r: f"rows{r}")
def test_two_pass_matches_numpy(dtype, rows_per_block, threaded):
    # 40-row blocks are shorter than n (dense QR of the pairs), 100 and 333 square R (tpqrt)
    values = matrix(3000, 100, dtype)
    u, s, vh = dask.compute(*two_pass_svd(da.from_array(values, chunks=(rows_per_block, 100))))
    expected = np.linalg.svd(values.astype(np.result_type(dtype, np.float64)), compute_uv=False)
    tolerance = 1e-5 if dtype in ("float32", "complex64") else 1e-12
    assert u.dtype == vh.dtype == np.dtype(dtype) and s.dtype == np.finfo(dtype).dtype
    np.testing.assert_allclose(s, expected, atol=tolerance * expected[0])
    np.testing.assert_allclose((u * s) @ vh, values, atol=tolerance * 10 * np.abs(values).max())
    rank = int((expected > 1e-6 * expected[0]).sum())  # 98: U's null-space columns are free
    gram = u[:, :rank].conj().T.astype(np.complex128) @ u[:, :rank]
    np.testing.assert_allclose(gram, np.eye(rank), atol=tolerance * 10)


def test_input_that_changes_between_the_passes_is_refused(threaded):
    # a graph that gives other values each time it runs: the second pass's QR cannot match
    counter = iter(range(10**6))

    def block(x):
        return x + next(counter) * np.eye(*x.shape, dtype=x.dtype)

    values = da.from_array(matrix(600, 50, "float64"), chunks=(200, 50)).map_blocks(block)
    u, _, _ = two_pass_svd(values)
    with pytest.raises(xm.MemchunkError, match="second QR of a 200x50 block differs"):
        u.compute()


def test_wide_data_is_decomposed_through_its_transpose(threaded):
    values = matrix(60, 900, "float64").reshape(60, 30, 30)
    original = values.copy()
    # the transposed blocks are Fortran-ordered float64: LAPACK must work on a copy of them
    x = xr.DataArray(values, dims=("time", "y", "x")).chunk({"y": 10})
    result = x.memchunk.apply(
        "svd", sample_dims="time", tsqr="two-pass", memory_limit="2GB"
    ).compute()
    flat = values.reshape(60, -1)
    np.testing.assert_allclose(result.S.values, np.linalg.svd(flat, compute_uv=False), rtol=1e-9)
    v = result.V.values.reshape(result.sizes["mode"], -1)
    np.testing.assert_allclose((result.U.values * result.S.values) @ v, flat, atol=1e-10)
    np.testing.assert_array_equal(values, original)  # the user's array is not overwritten


def test_auto_takes_two_passes_only_where_one_does_not_fit():
    x = xr.DataArray(
        da.zeros((60000, 2000), chunks=(1000, 2000), dtype="float32"), dims=("time", "space")
    )
    roomy = x.memchunk.plan("svd", sample_dims="time", memory_limit="3GB")
    assert any(n.startswith("exact SVD (one-pass tsqr) chosen") for n in roomy.notes)
    tight = x.memchunk.plan("svd", sample_dims="time", memory_limit="1.45GB")
    assert any(n.startswith("exact SVD (two-pass tsqr) chosen") for n in tight.notes)
    assert "svd-two-pass" in " ".join(tight.notes)
    # the tree's n x n factors, all on one worker, are in the footprint; blocks are >= n tall
    blocks = tight.dask_chunks["time"]
    assert min(blocks) >= 2000
    held = held_bytes_per_block(2000, np.dtype("float32"), dense=False)
    assert tight.factors_bytes >= len(blocks) * held > len(blocks) * 2000 * 2000 * 4
    with pytest.raises(xm.InfeasiblePlanError, match="two-pass tsqr") as refused:
        x.memchunk.plan("svd", sample_dims="time", memory_limit="700MB")
    two_pass = str(refused.value).split("two-pass tsqr")[1]
    assert "factors the operator holds" in two_pass  # its own term, not the input's
    assert "input chunks held" not in two_pass


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tsqr": "three-pass"}, "tsqr must be one of"),
        ({"method": "compressed", "k": 3, "tsqr": "two-pass"}, "does not use tsqr"),
    ],
)
def test_bad_tsqr_arguments(kwargs, match):
    x = xr.DataArray(np.zeros((100, 20)), dims=("time", "space")).chunk({"time": 50})
    with pytest.raises(xm.MemchunkError, match=match):
        x.memchunk.plan("svd", sample_dims="time", **kwargs)


@pytest.mark.cluster
def test_two_pass_plan_completes_where_one_pass_is_refused(quiet_distributed, tmp_path):
    from distributed import Client, LocalCluster

    # 24000 x 1500 float32 in Zarr (144 MB): one pass holds every float64 Q factor (288 MB)
    values = da.random.default_rng(0).standard_normal((24000, 1500), chunks=(1000, 1500))
    xr.DataArray(
        values.astype("float32"), dims=("time", "space"), name="field"
    ).to_dataset().to_zarr(tmp_path / "tall.zarr")
    x = xr.open_zarr(tmp_path / "tall.zarr")["field"]
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="700MB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = x.memchunk.plan("svd", sample_dims="time")
        result = x.memchunk.apply("svd", sample_dims="time")
        parts = result[["S", "U"]].isel(time=slice(0, 50))
        outcome = run_watched(client, "two-pass", lambda: parts)
        s, u_head = dask.compute(parts.S, parts.U)
    assert any(n.startswith("exact SVD (two-pass tsqr) chosen") for n in plan.notes), plan.notes
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    with dask.config.set(scheduler="threads"):
        flat = x.values.astype("float64")
    u, expected, _ = np.linalg.svd(flat, full_matrices=False)
    np.testing.assert_allclose(s.values, expected, rtol=1e-5)
    # columns agree up to sign
    np.testing.assert_allclose(np.abs(u_head.values[:, :5]), np.abs(u[:50, :5]), atol=1e-4)


def test_two_pass_blocks_are_at_least_as_tall_as_the_matrix_is_wide():
    # shorter blocks would give the tree dense QR nodes, whose factors the plan does not count
    x = xr.DataArray(
        da.zeros((40000, 4, 500), chunks=(100, 4, 500), dtype="float32"),
        dims=("time", "y", "x"),
    )
    given = x.memchunk.plan(
        "svd", sample_dims="time", tsqr="two-pass", chunks={"time": 300}, memory_limit="8GB"
    )
    assert min(given.dask_chunks["time"]) >= 2000
    assert any("shortest chunk, 2000, merged" in n for n in given.notes), given.notes
    stacked = x.stack(space=("y", "x"))  # rows of 2000 columns, (time) whole on the long side
    for limit in ("1.5GB", "3GB", "8GB"):
        plan = stacked.memchunk.plan("svd", sample_dims="time", tsqr="two-pass", memory_limit=limit)
        assert min(plan.dask_chunks["time"]) >= 2000, (limit, plan.dask_chunks["time"])
    wide = x.transpose("y", "x", "time")  # the long side stacks (time,): rows = time
    plan = wide.memchunk.plan("svd", sample_dims=("y", "x"), tsqr="two-pass", memory_limit="3GB")
    assert min(plan.dask_chunks["time"]) >= 2000


def test_second_pass_produces_every_input_block_again(threaded, produced):
    # xarray's stack makes a reshape layer of Task objects, which dask's bind copied without
    # renaming the keys inside (dask/dask#12455): both passes then shared the input blocks and
    # Dask held the whole input between them
    values = np.random.default_rng(0).standard_normal((1200, 4, 5))
    data = da.from_array(values, chunks=(300, 4, 5)).map_blocks(produced, dtype=values.dtype)
    x = xr.DataArray(data, dims=("time", "y", "x"))
    with dask.config.set({"memchunk.measure-input": False}):  # planning runs no block here
        result = x.memchunk.apply(
            "svd", sample_dims="time", tsqr="two-pass", chunks={"time": 300}, memory_limit="2GB"
        )
    s, _ = dask.compute(result.S, result.U)
    assert len(produced.shapes) == 2 * 4  # each of the 4 blocks, once per pass
    np.testing.assert_allclose(s.values, np.linalg.svd(values.reshape(1200, 20))[1], rtol=1e-10)


def test_copy_for_the_second_pass_shares_no_key_and_waits():
    from dask.core import get_dependencies
    from dask.utils import key_split

    from xarray_memchunk.operators.svd.tsqr import produced_again

    x = xr.DataArray(da.ones((40, 2, 3), chunks=(10, 2, 3)), dims=("time", "y", "x"))
    a = x.stack(space=("y", "x")).data  # its reshape is a layer of Task objects
    after = da.zeros(5, chunks=1)
    again = produced_again(a, after=after, seed="test")
    original, copy = dict(a.__dask_graph__()), dict(again.__dask_graph__())
    (blocker,) = (k for k in copy if key_split(k) == "checkpoint")
    own = {k for k in copy if not key_split(k).startswith(("checkpoint", "zeros"))}
    assert own and not own & set(original)
    for key in own:  # nothing of the original graph; each task waits for `after`, or for one
        deps = get_dependencies(copy, key)  # of the copy's tasks that does
        assert not deps & set(original) and (blocker in deps or deps & own), key
    np.testing.assert_array_equal(again.compute(scheduler="sync"), a.compute(scheduler="sync"))

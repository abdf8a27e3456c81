import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate
from xarray_memchunk.operators import get_operator
from xarray_memchunk.operators.svd.compressed import COMPRESSED_ITERATOR
from xarray_memchunk.testing import run_watched

#: A small (time, space) matrix whose costs the tests read.
MATRIX = xr.DataArray(np.zeros((40, 30), dtype="float32"), dims=("time", "space"))


def field(n_time, n_y, n_x, chunks, rank=None, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    if rank is None:
        values = rng.standard_normal((n_time, n_y * n_x))
    else:
        values = rng.standard_normal((n_time, rank)) @ rng.standard_normal((rank, n_y * n_x))
        values *= np.linspace(1, 3, rank).sum()
    data = values.reshape(n_time, n_y, n_x).astype(dtype)
    time = xr.Variable("time", np.arange(n_time), {"axis": "T"})
    return xr.DataArray(data, dims=("time", "y", "x"), coords={"time": time}).chunk(chunks)


@pytest.mark.parametrize("shape", [(3000, 10, 12), (60, 30, 40)], ids=["tall", "wide"])
def test_exact_matches_numpy_and_reconstructs(shape, threaded):
    x = field(*shape, chunks={"time": 25, "y": 5})
    plan = x.memchunk.plan("svd", sample_dims="time", method="exact", memory_limit="2GB")
    assert len([d for d, c in plan.dask_chunks.items() if len(c) > 1]) <= 1  # one dim chunked
    result = x.memchunk.apply(
        "svd", sample_dims="time", method="exact", memory_limit="2GB"
    ).compute()
    matrix = x.values.reshape(shape[0], -1)
    expected = np.linalg.svd(matrix, compute_uv=False)
    np.testing.assert_allclose(result.S.values, expected, rtol=1e-6)
    u = result.U.values
    v = result.V.values.reshape(result.sizes["mode"], -1)
    np.testing.assert_allclose((u * result.S.values) @ v, matrix, atol=1e-8)
    assert result.V.dims == ("mode", "y", "x") and result.U.dims == ("time", "mode")


def test_compressed_recovers_rank_k_subspace(threaded):
    x = field(2000, 30, 40, chunks={"time": 250, "y": 10}, rank=5)
    result = x.memchunk.apply("svd", sample_dims="T", method="compressed", k=5, memory_limit="2GB")
    assert result.V.chunks is not None
    result = result.compute()
    matrix = x.values.reshape(2000, -1)
    _, s_np, vt_np = np.linalg.svd(matrix, full_matrices=False)
    np.testing.assert_allclose(result.S.values, s_np[:5], rtol=1e-6)
    v = result.V.values.reshape(5, -1)
    # principal angles between the two 5-dim row spaces
    cosines = np.linalg.svd(v @ vt_np[:5].T, compute_uv=False)
    assert np.degrees(np.arccos(np.clip(cosines.min(), -1, 1))) < 0.01


def test_compressed_chunks_both_dims():
    x = field(20000, 50, 100, chunks={"time": 1000, "y": 10}, dtype="float32")
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=40 * 2**20, source="test"
    )
    plan = x.memchunk.plan("svd", sample_dims="time", method="compressed", k=10, budget=budget)
    assert len(plan.dask_chunks["time"]) > 1 and len(plan.dask_chunks["y"]) > 1
    assert plan.dask_chunks["x"] == (100,)
    assert plan.predicted_peak_bytes <= budget.per_task


@pytest.mark.parametrize("n_power_iter", [1, 2, 4])
def test_compressed_keeps_small_modes_next_to_a_dominant_one_in_float32(n_power_iter):
    # kelvin temperatures: s_1 / s_2 = 55. Dask's default power iterator multiplies
    # (A A^T)^q A out and lost s_2 (18% low at q = 2, overflow at q = 4), silently
    tas = synthetic_climate(365, 60, 90, chunks={"lat": 15})["tas"].fillna(0.0)
    result = tas.memchunk.apply(
        "svd", sample_dims="time", method="compressed", k=3, n_power_iter=n_power_iter
    )
    exact = np.linalg.svd(tas.values.reshape(365, -1).astype("float64"), compute_uv=False)
    np.testing.assert_allclose(result.S.values[:2], exact[:2], rtol=1e-5)


@pytest.mark.parametrize("n_power_iter", [0, 1, 2])
def test_compressed_tasks_per_chunk_matches_dasks_graph(n_power_iter):
    operator = get_operator("svd")
    counts = {}
    for blocks in (4, 8):
        x = da.random.random((blocks * 50, blocks * 50), chunks=50)
        u, _, _ = da.linalg.svd_compressed(
            x, 3, n_power_iter=n_power_iter, seed=0, iterator=COMPRESSED_ITERATOR
        )
        (u,) = dask.optimize(u)
        counts[blocks] = len(dict(u.__dask_graph__()))
    per_block = (counts[8] - counts[4]) / (8 * 8 - 4 * 4)
    kwargs = operator.check_arguments(
        {"sample_dims": "time", "method": "compressed", "k": 3, "n_power_iter": n_power_iter}
    )
    modelled = operator.cost(MATRIX, **kwargs).tasks_per_chunk
    assert per_block == pytest.approx(modelled, rel=0.15)


def test_compressed_plans_with_its_own_calibration_and_passes():
    x = field(20000, 50, 100, chunks={"time": 1000}, dtype="float32")
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=60 * 2**20, source="test"
    )
    plans = {
        q: x.memchunk.plan(
            "svd", sample_dims="time", method="compressed", k=10, n_power_iter=q, budget=budget
        )
        for q in (0, 2)
    }
    assert any(n.endswith("svd-compressed-cpu.json") for n in plans[0].notes)
    # two power iterations make 6 passes over the data instead of 2: about 3x the time
    ratio = plans[2].estimated_seconds / plans[0].estimated_seconds
    assert 2.0 < ratio < 3.5


@pytest.mark.parametrize("tsqr", ["one-pass", "two-pass"])
def test_the_exact_svd_times_its_columns_and_its_tree(tsqr):
    # a QR's time per element grows with the matrix's shorter side (the svd-cpu profiles), and
    # every block adds its n x n R factor to the tree that combines them: 40 short blocks
    # were estimated faster than 10 tall ones, while Dask's auto chunks (larger) ran 20-60%
    # faster than memchunk's plans in the randomized trials (22, 185, 609)
    from xarray_memchunk.operators.cost import bind_cost, resolve_cost
    from xarray_memchunk.operators.svd.exact import QR_COPY_COLUMNS

    op = get_operator("svd")
    kwargs = op.check_arguments({"sample_dims": "time", "method": "exact", "tsqr": tsqr})

    def matrix(columns, rows=10000):
        data = da.zeros((40000, columns), chunks=(rows, columns), dtype="float32")
        return xr.DataArray(data, dims=("time", "space"))

    costs = {}
    for columns in (250, 1000):
        x = matrix(columns)
        costs[columns] = resolve_cost(op, "x", x, *bind_cost(op, x, kwargs), "cpu")
    ratio = costs[1000].seconds_per_element / costs[250].seconds_per_element
    assert ratio == pytest.approx((1000 + QR_COPY_COLUMNS) / (250 + QR_COPY_COLUMNS))
    passes = 2 if tsqr == "two-pass" else 1
    tree = costs[1000].seconds_per_element / passes * 1000**2
    assert costs[1000].combine_seconds_per_chunk == pytest.approx(tree)
    budget = xm.Budget(
        worker_memory=16 * 10**9, threads_per_worker=1, n_workers=2, per_task=4 * 2**30, source="t"
    )
    estimated = {
        rows: matrix(1000, rows)
        .memchunk.plan("svd", budget=budget, chunks={"time": rows}, measure="never", **kwargs)
        .estimated_seconds
        for rows in (1000, 4000)
    }
    assert estimated[4000] < estimated[1000]


def test_a_calibration_records_the_work_its_time_was_measured_at():
    from xarray_memchunk.measure.calibrate import fit_record
    from xarray_memchunk.models.calibration import Calibration
    from xarray_memchunk.models.profiling import TaskProfile
    from xarray_memchunk.operators.svd.exact import QR_COPY_COLUMNS

    op = get_operator("svd")
    kwargs = op.check_arguments({"sample_dims": "time", "method": "exact", "tsqr": "one-pass"})
    rate = 2e-10  # seconds per element and column of work
    profiles = []
    for rows, columns in ((2000, 100), (5000, 300), (4000, 800), (10000, 1000), (8000, 1200)):
        extents = {"time": rows, "space": columns}
        seconds = rate * rows * columns * (columns + QR_COPY_COLUMNS)
        peak = 40 * rows * columns
        profiles.append(TaskProfile(extents, "float32", peak, 0, seconds, 1, "hwm", extents))
    record = fit_record(op, profiles, kwargs)
    measured_at = record["fit"]["work_per_element"]
    assert record["seconds_per_element"] / measured_at == pytest.approx(rate)
    assert "work_per_element" not in fit_record(op, profiles, kwargs, device="gpu")["fit"]
    # a plan of another matrix gets the rate at its own work, also from a file made before the
    # figure was recorded: the work of its profiles is found again
    work_of = op.cost(MATRIX, **kwargs).work_per_element
    older = {k: v for k, v in record["fit"].items() if k != "work_per_element"}
    for fit in (record["fit"], older):
        calibration = Calibration(
            "svd",
            "cpu",
            "float32",
            xm.LinearMemoryModel({}),
            record["seconds_per_element"],
            metadata={"fit": fit},
            profiles=tuple(record["profiles"]),
        )
        seconds = calibration.seconds_per_element_at({"time": 9000, "space": 500}, work_of)
        assert seconds == pytest.approx(rate * (500 + QR_COPY_COLUMNS))


def test_the_exact_svd_on_a_gpu_keeps_its_calibrated_time(monkeypatch):
    # the svd-gpu profiles' time per element did not follow the columns
    from xarray_memchunk.operators.svd import exact

    monkeypatch.setattr(exact, "device_of", lambda da: "gpu")
    op = get_operator("svd")
    for tsqr in ("one-pass", "two-pass"):
        kwargs = op.check_arguments({"sample_dims": "time", "method": "exact", "tsqr": tsqr})
        cost = op.cost(MATRIX, **kwargs)
        assert cost.work_per_element is None and cost.combine_elements_per_chunk == 0


def test_auto_with_user_chunks_takes_the_method_those_chunks_fit(recwarn):
    # regression: auto planned the exact SVD on chunks given for the compressed one, merged
    # time whole (a warning), predicted far over the budget, and killed 1.5 GB workers
    # stored in the chunks given below, so no rechunk holds pieces of it
    x = field(20000, 50, 100, chunks={"time": 5000, "y": 10}, dtype="float32")
    small = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=60 * 2**20, source="test"
    )
    chunks = {"time": 5000, "y": 10}
    plan = x.memchunk.plan("svd", sample_dims="time", k=10, budget=small, chunks=chunks)
    assert any(n.startswith("compressed SVD (k=10) chosen") for n in plan.notes)
    assert plan.dask_chunks["time"] == (5000,) * 4 and plan.dask_chunks["y"] == (10,) * 5
    assert plan.fits
    assert not [w for w in recwarn if issubclass(w.category, xm.MemoryBudgetWarning)]
    with pytest.warns(xm.MemoryBudgetWarning, match="predicted to need"):
        too_big = x.memchunk.plan("svd", sample_dims="time", k=10, budget=small, chunks=-1)
    assert any("chosen" in n for n in too_big.notes) and not too_big.fits


def test_auto_prefers_exact_then_compressed_then_explains():
    x = field(20000, 50, 100, chunks={"time": 1000}, dtype="float32")
    big = xm.Budget(
        worker_memory=10**11, threads_per_worker=1, n_workers=2, per_task=8 * 10**9, source="test"
    )
    small = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=60 * 2**20, source="test"
    )
    exact = x.memchunk.plan("svd", sample_dims="time", k=10, budget=big)
    assert any(n.startswith("exact SVD (one-pass tsqr) chosen") for n in exact.notes)
    compressed = x.memchunk.plan("svd", sample_dims="time", k=10, budget=small)
    assert any(n.startswith("compressed SVD (k=10) chosen") for n in compressed.notes)
    assert any("not exact SVD" in n for n in compressed.notes)
    with pytest.raises(xm.InfeasiblePlanError, match="no k was given"):
        x.memchunk.plan("svd", sample_dims="time", budget=small)


ONE_PASS, TWO_PASS = "exact SVD (one-pass tsqr)", "exact SVD (two-pass tsqr)"
COMPRESSED = "compressed SVD (k=3)"


@pytest.mark.parametrize(
    ("method", "tsqr", "expected"),
    [
        ("auto", "auto", [ONE_PASS, TWO_PASS, COMPRESSED]),
        ("auto", "one-pass", [ONE_PASS, COMPRESSED]),
        ("auto", "two-pass", [TWO_PASS, COMPRESSED]),
        ("exact", "auto", [ONE_PASS, TWO_PASS]),
        ("exact", "one-pass", [ONE_PASS]),
        ("exact", "two-pass", [TWO_PASS]),
        ("compressed", "auto", [COMPRESSED]),
    ],
)
def test_method_and_tsqr_select_the_algorithms_and_their_calibrations(method, tsqr, expected):
    operator = get_operator("svd")
    kwargs = operator.check_arguments(dict(sample_dims="time", method=method, k=3, tsqr=tsqr))
    alternatives = operator.alternatives(kwargs)
    assert [label for label, _, _ in alternatives] == expected
    keys = {ONE_PASS: "svd", TWO_PASS: "svd-two-pass", COMPRESSED: "svd-compressed"}
    for label, chosen, _ in alternatives:  # the calibration files' names
        assert operator.cost(MATRIX, **chosen).calibration_key == keys[label]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs sample_dims"),
        ({"sample_dims": "time", "method": "compressed"}, "needs k="),
        ({"sample_dims": "time", "method": "lanczos"}, "method must be one of"),
        ({"sample_dims": "time", "k": 0}, "positive int"),
        ({"sample_dims": ("time", "y", "x")}, "at least one feature dim"),
    ],
)
def test_bad_svd_arguments(kwargs, match):
    with pytest.raises(xm.MemchunkError, match=match):
        field(100, 4, 5, chunks={"time": 50}).memchunk.plan("svd", **kwargs)


@pytest.mark.cluster
def test_naive_chunks_fail_planned_svd_completes(quiet_distributed):
    from distributed import Client, LocalCluster

    # stored in 2000 x 250 tiles: both dims chunked, as a Zarr store often is
    values = da.random.default_rng(0).standard_normal((20000, 1000), chunks=(2000, 250))
    x = xr.DataArray(values.astype("float32"), dims=("time", "space"))
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="1GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        naive = run_watched(client, "naive", lambda: da.linalg.svd(x.data)[1])
        planned = run_watched(
            client, "memchunk", lambda: x.memchunk.apply("svd", sample_dims="time").S
        )
        s = x.memchunk.apply("svd", sample_dims="time").S.compute()
    assert not naive.completed and "one dimension" in naive.error
    assert planned.completed, planned.error
    assert planned.worker_deaths == 0 and planned.pauses == 0
    with dask.config.set(scheduler="threads"):
        expected = np.linalg.svd(x.values.astype("float64"), compute_uv=False)
    np.testing.assert_allclose(s.values, expected, rtol=1e-4)  # float32 input


def test_compressed_svd_holds_its_input_only_below_the_spill_line():
    from xarray_memchunk.clusters import ClusterFacts
    from xarray_memchunk.operators.svd.compressed import holds_input

    facts = ClusterFacts(
        memory_limit=1_500_000_000,
        threads_per_worker=1,
        n_workers=2,
        address="tcp://x",
        largest_process_memory=200_000_000,
    )
    block = 100_000_000
    # room per worker: 0.6 x 1.5 GB - 200 MB - 2 x 100 MB = 500 MB; 2 workers x 80%: 800 MB
    assert holds_input(800_000_000, block, facts, 0.6)
    assert not holds_input(800_000_001, block, facts, 0.6)
    assert not holds_input(1, 400_000_000, facts, 0.6)  # no room beside the tasks
    unlimited = ClusterFacts(None, 1, 2, "tcp://x", 200_000_000)
    assert not holds_input(1, block, unlimited, 0.6)


def test_compressed_svd_on_the_threaded_scheduler_produces_its_input_per_pass(threaded, produced):
    # held between passes, the whole input would stay in this process, beyond the plan
    rng = np.random.default_rng(0)
    modes = rng.standard_normal((2000, 3)) @ rng.standard_normal((3, 600)) * 10.0
    values = (modes + rng.standard_normal((2000, 600))).astype("float32")
    source = da.from_array(values, chunks=(500, 600)).map_blocks(produced, dtype="float32")
    x = xr.DataArray(source, dims=("time", "space"))
    result = x.memchunk.apply(
        "svd", sample_dims="time", method="compressed", k=3, n_power_iter=0, memory_limit="1GB"
    )
    s = result.S.compute()
    full_blocks = [shape for shape in produced.shapes if shape == (500, 600)]
    assert len(full_blocks) >= 2 * 4  # both passes produced all 4 blocks
    expected = np.linalg.svd(values.astype("float64"), compute_uv=False)[:3]
    np.testing.assert_allclose(s.values, expected, rtol=1e-2)


@pytest.mark.parametrize("margin", [0.8, 0.0], ids=["held", "produced-per-pass"])
def test_compressed_svd_held_or_produced_per_pass_gives_the_same_result(
    margin, monkeypatch, quiet_distributed
):
    from distributed import Client, LocalCluster

    from xarray_memchunk.operators.svd import compressed

    monkeypatch.setattr(compressed, "HOLD_MARGIN", margin)  # 0: no room: produced per pass
    x = field(4000, 20, 25, {"time": 500}, rank=8, dtype="float32")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="1GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        held = compressed._input_fits_in_workers(x.data)
        wide = da.zeros((20000, 10000), chunks=(2000, 10000), dtype="float32")
        assert not compressed._input_fits_in_workers(wide)  # 800 MB: over 2 x 0.6 GB with tasks
        result = x.memchunk.apply("svd", sample_dims="time", k=5, method="compressed")
        s = result.S.compute()
    assert held == (margin > 0)  # 8 MB of input
    expected = np.linalg.svd(x.values.reshape(4000, -1).astype("float64"), compute_uv=False)
    np.testing.assert_allclose(s.values, expected[:5], rtol=1e-3)

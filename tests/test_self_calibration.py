"""User functions planned with no model written by hand: they measure themselves (issue 14)."""

import ctypes
import importlib.metadata
import itertools
import json
import math
import re
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk.errors import MeasuringWorkerDiedError
from xarray_memchunk.measure import calibrate, self_calibration
from xarray_memchunk.measure.calibrate import trusted_range
from xarray_memchunk.measure.self_calibration import (
    DEFAULT_SECONDS,
    HALO_WORK_SHARE,
    MAX_WORK_SECONDS,
    OWN_SHARE,
    _work_bound,
    growing_shapes,
    own_share_elements,
    self_calibrate,
)
from xarray_memchunk.memory_limits import DEFAULT_WORKER_BASELINE
from xarray_memchunk.models import load_calibration
from xarray_memchunk.models.probe_process import ProbeProcess, close_kept_probe_process
from xarray_memchunk.models.profiling import TaskProfile, measures_here
from xarray_memchunk.operators import DimUse
from xarray_memchunk.planning.problem import DimRole
from xarray_memchunk.units import to_bytes

pytestmark = pytest.mark.cluster


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    return tmp_path


def smooth(block):
    return ndimage.uniform_filter(block, size=5, mode="reflect")


def field(shape=(2000, 1500), chunks=(500, 1500)):
    data = da.random.default_rng(0).random(shape, chunks=chunks, dtype="float32")
    return xr.DataArray(data, dims=("y", "x"), name="f")


def test_a_function_calibrates_itself_once_and_again_when_changed(user_dir, threaded):
    op = xm.BlockwiseOperator("selfcal-smooth", smooth, depth={"y": 2, "x": 2})
    data = field()
    first = data.memchunk.plan(op, memory_limit="2GB")
    note = next(n for n in first.notes if n.startswith("memory model calibrated now"))
    assert "(the plan ran the operator, on float32 data)" in note  # one note per dtype measured
    assert int(note.split(": ")[1].split(" blocks")[0]) >= 3
    saved = json.loads((user_dir / f"{op.calibration}-cpu.json").read_text())
    for package in calibrate.RECORDED_PACKAGES:
        assert saved["versions"][package] == importlib.metadata.version(package)
    again = data.memchunk.plan(op, memory_limit="2GB")
    assert not any(n.startswith("memory model calibrated now") for n in again.notes)
    assert again.dask_chunks == first.dask_chunks
    # the model covers what was measured (the conservative fit of the shipped calibrations)
    calibration = load_calibration(op.calibration, "cpu", "float32")
    for profile in calibration.profiles:
        input_bytes = 4 * np.prod(list(profile["extents"].values()))
        features = {"input_bytes": np.array([input_bytes]), "output_bytes": np.array([input_bytes])}
        predicted = calibration.model.peak_bytes(features)[0]
        assert predicted >= 0.97 * profile["peak_bytes"] - 4 * 2**20

    def wider(block):  # the operator's function changed: another calibration
        return ndimage.uniform_filter(block, size=7, mode="reflect")

    changed = xm.BlockwiseOperator("selfcal-smooth", wider, depth={"y": 3, "x": 3})
    assert changed.calibration != op.calibration
    assert any(
        n.startswith("memory model calibrated now")
        for n in data.memchunk.plan(changed, memory_limit="2GB").notes
    )
    out = data.memchunk.apply(op, memory_limit="2GB").values
    np.testing.assert_array_equal(out, smooth_reference(data.values))


def test_the_versions_a_calibration_records_import_nothing():
    # importing distributed to read its version took 0.24-0.29 s of a plan without a cluster
    code = (
        "import sys\n"
        "from xarray_memchunk.measure.calibrate import RECORDED_PACKAGES, _versions\n"
        "before = set(sys.modules)\n"
        "versions = _versions()\n"
        "assert set(sys.modules) - before <= {'importlib.metadata'}, set(sys.modules) - before\n"
        "assert all(versions[p] != 'not installed' for p in RECORDED_PACKAGES), versions\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_calibration_stopped_by_a_small_budget_is_measured_again_for_a_larger_one(
    user_dir, threaded
):
    def hungry(block):  # about 100 x its block
        return np.stack([block] * 100).sum(0)

    op = xm.BlockwiseOperator("selfcal-hungry", hungry)
    data = field()

    def trusted() -> float:
        return load_calibration(op.calibration, "cpu", "float32").metadata["fit"][
            "max_task_elements"
        ]

    small = data.memchunk.plan(op, memory_limit="500MB")
    assert any(n.startswith("memory model calibrated now") for n in small.notes)
    narrow = trusted()
    assert narrow < data.size  # the budget stopped the blocks
    with dask.config.set({"memchunk.self-calibration-seconds": 20}):  # time never stops it
        large = data.memchunk.plan(op, memory_limit="8GB")
    assert any("measured again on larger blocks" in n for n in large.notes)
    assert trusted() > narrow
    # the wider range is kept: planning under the small budget again measures nothing
    again = data.memchunk.plan(op, memory_limit="500MB")
    assert not any("calibrated now" in n for n in again.notes)


def test_a_calibration_of_a_small_example_is_measured_again_for_a_larger_array(user_dir, threaded):
    # a user tries the function on a toy array first: its blocks grow to all 30 elements, and
    # plans of a larger array would be held to tasks of that size (or refused)
    op = xm.BlockwiseOperator("selfcal-example-first", smooth, depth={"y": 2, "x": 2})
    toy = field((5, 6), (5, 6))
    toy.memchunk.plan(op, memory_limit="1GB")
    fit = load_calibration(op.calibration, "cpu", "float32").metadata["fit"]
    assert fit["whole_array_elements"] == 30
    data = field()
    plan = data.memchunk.plan(op, memory_limit="1GB")
    assert any("measured a smaller array whole (30 elements" in n for n in plan.notes)
    assert math.prod(max(c) for c in plan.dask_chunks.values()) > 1000
    # measured on the larger array, its range serves both: neither plan measures again
    for array in (data, toy):
        again = array.memchunk.plan(op, memory_limit="1GB")
        assert not any("calibrated now" in n for n in again.notes)


def test_a_refusal_for_the_measured_range_is_said_once_when_staging_cannot_help(user_dir):
    def smooth7(block):
        return ndimage.uniform_filter(block, size=7)

    op = xm.BlockwiseOperator("selfcal-range-refusal", smooth7, depth={"y": 3, "x": 3})
    field((5, 6), (5, 6)).memchunk.plan(op, memory_limit="1GB")  # measured on 30 elements
    data = da.random.default_rng(0).random((2, 600, 600), chunks=(1, 200, 200), dtype="float32")
    volume = xr.DataArray(data, dims=("t", "y", "x"))
    with pytest.raises(xm.InfeasiblePlanError) as refused:  # 1 x 9 x 9 padded is over 30
        volume.memchunk.plan(op, memory_limit="1GB", measure="never")
    message = str(refused.value)
    assert message.count("every chunking") == 1, message
    assert message.endswith(
        "Staged in a temporary Zarr store, it does not fit either, for the same reason."
    )


def test_a_calibration_stopped_by_budget_and_time_at_once_is_measured_again(user_dir, monkeypatch):
    # time ran out at the block where the budget also stopped: a larger budget's plan would be
    # held to this range, so the block that stopped it is recorded all the same
    def hungry(block):  # about 100 x its block
        return np.stack([block] * 100).sum(0)

    op = xm.BlockwiseOperator("selfcal-hungry-slow", hungry)
    monkeypatch.setattr(self_calibration, "_grow", lambda *args, **kwargs: False)
    self_calibrate(op, field(), {}, per_task=8 * 2**20)
    fit = load_calibration(op.calibration, "cpu", "float32").metadata["fit"]
    assert fit["next_block_peak_bytes"] > 8 * 2**20


def smooth_reference(values):
    return ndimage.uniform_filter(values, size=5, mode="reflect")


def test_calibration_time_is_bounded(user_dir):
    op = xm.BlockwiseOperator("selfcal-slow", smooth, depth={"y": 2, "x": 2})
    with dask.config.set({"memchunk.self-calibration-seconds": 1.0}):
        plan = field((4000, 4000), (1000, 4000)).memchunk.plan(op, memory_limit="2GB")
    note = next(n for n in plan.notes if n.startswith("memory model calibrated now"))
    seconds = float(re.search(r"in ([0-9.]+) s;", note).group(1))
    assert seconds < 1.0 + 10  # the bound, plus starting a profiling worker
    assert plan.binding in {
        "measured range",
        "parallelism",
        "task overhead",
        "memory",
        "storage alignment",
    }


def grows_faster(block):
    """Needs block.size ** 1.15 float64 scratch: superlinear in the block."""
    scratch = np.ones(int(block.size**1.15))
    return block * 2 + scratch[:1].astype(block.dtype)


def hungry_past_a_size(block):
    """Twenty copies of the block, but only for blocks of more than 2**19 elements."""
    if block.size <= 2**19:
        return block + 1
    copies = [block + i for i in range(20)]
    return sum(copies) / 20


@pytest.mark.parametrize("func", [grows_faster, hungry_past_a_size])
def test_functions_that_outgrow_a_line_never_exceed_the_budget(func, user_dir, quiet_distributed):
    from distributed import Client, LocalCluster

    from xarray_memchunk.testing import run_watched

    op = xm.BlockwiseOperator(f"selfcal-{func.__name__}", func)
    data = field((6000, 4000), (250, 4000))
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="600MB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = data.memchunk.plan(op)
        assert plan.predicted_peak_bytes <= plan.budget.per_task
        largest = load_calibration(op.calibration, "cpu", "float32").metadata["fit"]
        padded = np.prod([max(c) for c in plan.dask_chunks.values()])
        assert padded <= largest["max_task_elements"]  # within the measured range
        outcome = run_watched(client, "selfcal", lambda: data.memchunk.apply(op).data.sum())
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    assert outcome.peak_bytes < 0.8 * to_bytes("600MB")


def holds_eight_copies(block):
    """Eight copies of the block: memory that grows with it."""
    return sum(block + i for i in range(8)) / 8


def test_a_calibration_for_a_larger_budget_stays_within_the_measuring_workers_room(
    user_dir, cluster_client
):
    """A new user's plan that no memory fits searched the least memory_limit by planning at
    it, and measured blocks for its 315.8 MiB tasks in a 500 MB worker, which was killed."""
    from xarray_memchunk.models.profiling import measuring_worker
    from xarray_memchunk.testing import watch

    make, Client = cluster_client
    op = xm.BlockwiseOperator("selfcal-eight-copies", holds_eight_copies)
    data = field((6000, 4000), (250, 4000))
    with make("500MB") as cluster, Client(cluster) as client:
        worker = client.scheduler_info()["workers"][measuring_worker(client)]
        room = 0.8 * worker["memory_limit"] - worker["metrics"]["memory"]  # pause less held
        # a budget this worker lacks
        outcome = watch(client, "selfcal", lambda: self_calibrate(op, data, {}, per_task=2 * 10**9))
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    profiles = load_calibration(op.calibration, "cpu", "float32").profiles
    assert max(p["peak_bytes"] for p in profiles) <= room


def kills_its_worker(block):
    """Touches 2 GB whatever the block: past any small worker's memory limit."""
    waste = np.ones(2 * 10**9 // 8)
    return block + waste[0]


def test_a_measurement_that_kills_its_worker_raises_and_never_hangs(user_dir, quiet_distributed):
    from distributed import Client, LocalCluster

    op = xm.BlockwiseOperator("selfcal-killer", kills_its_worker)
    data = field((400, 400), (100, 400))
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="400MB", dashboard_address=":0"
        ) as cluster,
        Client(cluster),
        # on the small first block, run unmeasured: its death is not taken for the function's
        # own failure (which would go on to kill the worker again on a larger block)
        pytest.raises(MeasuringWorkerDiedError, match="block of y=64 x x=64 died"),
    ):
        data.memchunk.plan(op)
    assert issubclass(MeasuringWorkerDiedError, xm.CalibrationError)


def c_allocation(block):
    """Allocates ten times the block with libc's malloc (numpy never sees it), touches it."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    size = 10 * block.nbytes
    pointer = libc.malloc(size)
    ctypes.memset(pointer, 1, size)
    libc.free(ctypes.c_void_p(pointer))
    return block.copy()


def test_memory_c_libraries_allocate_is_measured(user_dir):
    op = xm.BlockwiseOperator("selfcal-c", c_allocation)
    field((4000, 2000), (500, 2000)).memchunk.plan(op, memory_limit="4GB")
    model = load_calibration(op.calibration, "cpu", "float32").model
    per_byte = sum(model.coefficients.values())  # input and output bytes are one block each
    assert per_byte > 10  # the malloc'd ten blocks, the input, the copy


def test_functions_that_change_dtype_drop_and_add_dims(user_dir, threaded):
    cube = xr.DataArray(
        da.random.default_rng(1).random((120, 30, 40), chunks=(120, 10, 40), dtype="float32"),
        dims=("time", "y", "x"),
        name="tas",
    )
    spread = xm.BlockwiseOperator(
        "selfcal-spread", lambda b: b.max(axis=0) - b.min(axis=0), drop_dims=("time",)
    )
    result = cube.memchunk.apply(spread, memory_limit="2GB")
    assert result.dims == ("y", "x")
    np.testing.assert_array_equal(result.values, cube.values.max(0) - cube.values.min(0))
    stats = xm.BlockwiseOperator(
        "selfcal-stats",
        lambda b: np.stack([b.mean(axis=0), b.std(axis=0)], axis=-1).astype("float64"),
        drop_dims=("time",),
        new_dims={"stat": 2},
        dtype="float64",
    )
    out = cube.memchunk.apply(stats, memory_limit="2GB")
    assert out.dims == ("y", "x", "stat") and out.dtype == np.float64
    np.testing.assert_allclose(out.values[..., 1], cube.values.std(0), rtol=1e-5)


def test_a_deliberately_small_model_learns_from_a_paused_run(user_dir, quiet_distributed):
    from distributed import Client, LocalCluster

    from xarray_memchunk.testing import run_watched

    def hog(block):
        copies = [block * (i + 1) for i in range(80)]
        return sum(copies) / 3240

    wrong = xm.LinearMemoryModel({"input_bytes": 1.0})  # the truth is 81 x the input
    op = xm.BlockwiseOperator("learn-hog", hog, memory_model=wrong)
    data = xr.DataArray(
        da.random.default_rng(0).random((4000, 6000), chunks=(100, 6000)), dims=("y", "x")
    )
    outcomes, reports, plans = [], [], []
    for _ in range(2):
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 3}),
            LocalCluster(
                n_workers=2, threads_per_worker=1, memory_limit="1GB", dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            plans.append(data.memchunk.plan(op))
            # a run whose workers pause over memory that never frees would wait forever
            outcomes.append(
                run_watched(client, "hog", lambda: plans[-1].apply().data.sum(), timeout=180)
            )
            reports.append(plans[-1].report())
    first, second = outcomes
    assert first.pauses > 0 or first.worker_deaths > 0  # the wrong model hurt the first run
    assert reports[0].learned.startswith("kept")
    if first.worker_deaths:  # the killed task's peak is only a floor
        assert "a worker was killed" in reports[0].learned
    # far above its prediction (or a floor): the model is wrong, the function is measured
    assert any("measured again" in note for note in plans[1].notes)
    assert second.completed and second.pauses == 0 and second.worker_deaths == 0
    assert reports[1].measured_task_bytes <= 1.05 * reports[1].predicted_task_bytes


def test_models_are_trusted_twice_as_far_only_where_they_grew_linearly():
    def measured(n, peak):
        return TaskProfile({"x": n}, "float32", peak, 0, 0.1, 1, "hwm", {"x": n})

    assert trusted_range([measured(1000, 10_000), measured(2000, 20_000)]) == 4000
    # 12.5% faster than its block: not extrapolated
    assert trusted_range([measured(1000, 10_000), measured(2000, 22_500)]) == 2000
    assert trusted_range([measured(2000, 20_000)]) == 2000


def test_long_work_lets_calibration_measure_larger_blocks():
    # the largest block: 1 s on 2**20 elements
    largest = TaskProfile({"x": 2**20}, "float32", 0, 0, 1.0, 1, "hwm", {"x": 2**20})
    assert _work_bound(largest, {"x": 2**24}) < DEFAULT_SECONDS  # 16 s of work: the default
    assert _work_bound(largest, {"x": 2**30}) == pytest.approx(0.01 * 1024)  # 1024 s: 1%
    assert _work_bound(largest, {"x": 2**34}) == MAX_WORK_SECONDS


def test_a_stencils_calibration_aims_at_tasks_two_thirds_their_own():
    assert OWN_SHARE == pytest.approx(2 / 3)
    halo = {d: DimUse(DimRole.HALO, depth=10) for d in ("z", "y", "x")}
    sizes = {"z": 776, "y": 731, "x": 731}
    # a cube's own share (s / (s + 20))**3 reaches 2/3 at s = 139: 159**3 = 4,019,679 padded
    padded = own_share_elements(sizes, [], halo)
    assert 4_019_679 <= padded < 2 * 4_019_679
    free = {d: DimUse() for d in sizes}
    assert own_share_elements(sizes, [], free) == 0
    # a trailing window along time only: the first, smallest block is 92% its own
    window = {"time": DimUse(DimRole.HALO, depth=(29, 0)), "y": DimUse(), "x": DimUse()}
    assert own_share_elements({"time": 10_000, "y": 100, "x": 100}, [], window) < 2**13
    assert _work_bound(
        TaskProfile({"x": 2**20}, "float32", 0, 0, 1.0, 1, "hwm", {"x": 2**20}),
        {"x": 2**28},
        HALO_WORK_SHARE,
    ) == pytest.approx(HALO_WORK_SHARE * 256)


def test_growing_shapes_keep_whole_dims_and_double():
    shapes = list(growing_shapes({"time": 300, "y": 200, "x": 100}, ["time"], start=2**16))
    assert all(s["time"] == 300 for s in shapes)
    elements = [np.prod(list(s.values())) for s in shapes]
    assert all(b > a for a, b in itertools.pairwise(elements))
    assert shapes[-1] == {"time": 300, "y": 200, "x": 100}


def _block(elements: int, seconds: float, peak: int) -> TaskProfile:
    return TaskProfile({"x": elements}, "float32", peak, 0, seconds, 1, "hwm", {"x": 2**30})


def test_a_block_that_would_still_be_too_short_to_stop_at_is_skipped():
    # 0.12 s on 64,000 elements and 0.22 s on 132,651, as the seed's GST3D ran: a block twice
    # as large runs ~0.41 s on their line, too short to stop at, and one four times as large
    # ~0.85 s: the one after is measured
    blocks = [_block(64_000, 0.12, 15 * 2**20), _block(132_651, 0.22, 30 * 2**20)]
    assert self_calibration._seconds_at(2.0, blocks) == pytest.approx(
        0.22 + 0.10 / 68_651 * 132_651
    )
    assert self_calibration._step(blocks) == 4.0
    # a block twice as large would be long enough: the blocks double
    slower = [_block(64_000, 0.12, 15 * 2**20), _block(132_651, 0.3, 30 * 2**20)]
    assert self_calibration._step(slower) == 2.0
    # a fast function: four times as large would still be too short, so the blocks double
    fast = [_block(64_000, 0.004, 15 * 2**20), _block(132_651, 0.008, 30 * 2**20)]
    assert self_calibration._step(fast) == 2.0
    # the last was long enough to stop at: the blocks double, as they always did
    long_enough = [*blocks, _block(531_441, 0.86, 120 * 2**20)]
    assert self_calibration._step(long_enough) == 2.0
    # a single block, or one whose peak is lost in noise: nothing to extrapolate from
    assert self_calibration._step(blocks[:1]) == 2.0
    assert self_calibration._step([blocks[0], _block(132_651, 0.22, 0)]) == 2.0


def test_the_peak_of_the_next_block_follows_the_last_two_blocks_growth():
    blocks = [_block(64_000, 0.01, 10 * 2**20), _block(128_000, 0.02, 40 * 2**20)]  # peak ~ n^2
    assert self_calibration._exponent(blocks) == pytest.approx(2.0)
    assert self_calibration._next_peak(blocks, 4.0) == pytest.approx(16 * 40 * 2**20)
    assert self_calibration._next_peak(blocks, 2.0) == pytest.approx(4 * 40 * 2**20)
    # a peak that grew slower than its block is extrapolated in proportion, no less
    flat = [_block(64_000, 0.01, 10 * 2**20), _block(128_000, 0.02, 12 * 2**20)]
    assert self_calibration._next_peak(flat, 4.0) == pytest.approx(4 * 12 * 2**20)


def test_a_skip_that_the_budget_does_not_hold_doubles_instead(user_dir, monkeypatch):
    # blocks measured as 100 bytes per element, a skip asked for at every block, a budget of
    # 250 MB: 1 Mi elements (105 MB) four times larger would be over it, twice larger not
    measured = []

    def measured_as_linear(profiler, runner, cases, dtype, repeats=1):
        extents, array = dict(cases[0][0]), dict(cases[0][1])
        elements = math.prod(extents.values())
        measured.append(elements)
        return [TaskProfile(extents, dtype, 100 * elements, 0, 1e-4, repeats, "hwm", array)]

    monkeypatch.setattr(self_calibration, "profile_in_worker", measured_as_linear)
    monkeypatch.setattr(self_calibration, "_step", lambda profiles: 4.0)
    op = xm.BlockwiseOperator("selfcal-skip-budget", smooth, depth={"y": 2, "x": 2})
    self_calibrate(op, field(), {}, per_task=250_000_000)
    grown = measured[1 : measured.index(max(measured)) + 1]  # after the warm-up block
    steps = [b / a for a, b in itertools.pairwise(grown)]
    assert [round(s) for s in steps] == [4, 4, 2]
    assert 100 * grown[-1] <= 250_000_000
    fit = load_calibration(op.calibration, "cpu", "float32").metadata["fit"]
    assert fit["next_block_peak_bytes"] > 250_000_000  # the whole array, 300 MB, stopped it


def smooth_keeping_a_cache(block):
    """``smooth``, keeping 320 MiB after its first call, as a library's import or cache would."""
    import builtins

    if not hasattr(builtins, "_memchunk_test_cache"):
        builtins._memchunk_test_cache = np.ones(40 * 2**20)  # written: resident
    return smooth(block)


@pytest.fixture
def cache_dropped():
    """Drop what ``smooth_keeping_a_cache`` kept here (dask calls it here to infer meta)."""
    import builtins

    yield
    vars(builtins).pop("_memchunk_test_cache", None)


def test_what_a_function_leaves_in_a_worker_raises_the_baseline(user_dir, cache_dropped):
    plain = xm.BlockwiseOperator("selfcal-plain", smooth, depth={"y": 2, "x": 2})
    keeping = xm.BlockwiseOperator("selfcal-keep", smooth_keeping_a_cache, depth={"y": 2, "x": 2})
    data = field()
    before = data.memchunk.plan(plain, memory_limit="2GB")
    after = data.memchunk.plan(keeping, memory_limit="2GB")
    configured = to_bytes(DEFAULT_WORKER_BASELINE)
    assert configured <= before.budget.worker_baseline < configured + 64 * 2**20  # scipy's import
    assert after.budget.worker_baseline >= configured + 320 * 2**20
    assert "once it has run 'selfcal-keep'" in after.budget.explain()
    assert after.budget.per_task < before.budget.per_task
    with pytest.raises(xm.InfeasiblePlanError, match=r"no room for a task.*once it has run"):
        data.memchunk.plan(keeping, memory_limit="600MB")  # the cache leaves no room
    fit = load_calibration(keeping.calibration, "cpu", "float32").metadata["fit"]
    rise = fit["resident_after_bytes"] - fit["resident_before_bytes"]
    assert 320 * 2**20 <= rise < 400 * 2**20


def test_measured_again_where_it_ran_before_the_rise_is_not_forgotten(user_dir, cache_dropped):
    """A resample calibrated in a fresh process rose by 100.6 MB; measured again for a
    refusal's minimum, in the process that had run it, by 0.3 MB, which the next plan counted,
    and its stated minimum was refused again on a new cluster."""
    keeping = xm.BlockwiseOperator("selfcal-keep-2", smooth_keeping_a_cache, depth={"y": 2, "x": 2})
    data = field()

    def rise():
        fit = load_calibration(keeping.calibration, "cpu", "float32").metadata["fit"]
        return fit["resident_after_bytes"] - fit["resident_before_bytes"]

    close_kept_probe_process()  # one that ran the function in an earlier test holds its cache
    self_calibrate(keeping, data, {}, per_task=250_000_000)
    assert rise() >= 320 * 2**20
    self_calibrate(keeping, data, {}, per_task=250_000_000)  # where the cache is kept already
    assert rise() >= 320 * 2**20


def smooth_keeping_a_cache_scaled(block, factor=1.0):
    return smooth_keeping_a_cache(block) * factor


def test_another_way_of_the_same_operator_keeps_the_rise_the_first_measured(
    user_dir, cache_dropped
):
    """A groupby's map-reduce rose by 85.4 MiB importing flox's kernels, then its blockwise,
    where they were imported, by 13.6 MiB; planned with no worker, the run peaked at 0.99 of
    the pause line. Here the same operator with another argument (another calibration)."""
    op = xm.BlockwiseOperator("selfcal-keep-3", smooth_keeping_a_cache_scaled, depth={"y": 2})
    data = field()

    def rise(factor):
        key = op.cost(data, factor=factor).calibration_key
        fit = load_calibration(key, "cpu", "float32").metadata["fit"]
        return fit["resident_after_bytes"] - fit["resident_before_bytes"]

    close_kept_probe_process()
    self_calibrate(op, data, {"factor": 1.0}, per_task=250_000_000)
    self_calibrate(op, data, {"factor": 2.0}, per_task=250_000_000)
    assert op.cost(data, factor=1.0).calibration_key != op.cost(data, factor=2.0).calibration_key
    assert rise(1.0) >= 320 * 2**20 and rise(2.0) >= 320 * 2**20


def test_what_stays_after_running_is_the_rise_on_top_of_the_baseline():
    from xarray_memchunk.models.calibration import Calibration

    def calibration(**figures):
        return Calibration("f", "cpu", "float32", None, 0.0, metadata={"fit": figures})

    held = calibration(resident_before_bytes=150, resident_after_bytes=250)
    assert held.held_after_running(200) == 300  # the baseline and the rise of 100 on top
    dirty = calibration(resident_before_bytes=900, resident_after_bytes=950)
    assert dirty.held_after_running(200) == 250  # measured where earlier data was held
    assert calibration().held_after_running(200) is None  # calibrated before this was recorded


def smooth_of_many_rows(block):
    """``smooth``, for blocks of 100 rows or more (as a function with a window may be)."""
    if block.shape[0] < 100:
        raise ValueError(f"needs 100 rows or more, got {block.shape[0]}")
    return smooth(block)


def test_a_small_block_takes_the_first_run_or_the_first_block_runs_three_times(user_dir, threaded):
    plain = xm.BlockwiseOperator("selfcal-warm", smooth, depth={"y": 2, "x": 2})
    choosy = xm.BlockwiseOperator("selfcal-choosy", smooth_of_many_rows, depth={"y": 2, "x": 2})
    data = field()
    for op, first_runs in ((plain, 1), (choosy, 3)):  # choosy fails on the small block
        plan = data.memchunk.plan(op, memory_limit="2GB")
        assert any(n.startswith("memory model calibrated now") for n in plan.notes)
        profiles = load_calibration(op.calibration, "cpu", "float32").profiles
        assert profiles[0]["runs"] == first_runs
        assert all(p["runs"] == 1 for p in profiles[1:])
        assert min(p["extents"]["y"] for p in profiles) >= 100  # the small block is not fitted


def test_a_cluster_of_threads_here_measures_in_this_process():
    from distributed import Client, LocalCluster

    with ProbeProcess() as probe:
        assert not measures_here(probe)
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        assert measures_here(client)  # no scikit-learn imported beside its blocks then


class CallOrder(list):
    """Names of the watched calls, in the order they were made."""

    def watched(self, name, func):
        def run(*args, **kwargs):
            self.append(name)
            return func(*args, **kwargs)

        return run


def made_by_a_graph():
    """``field()`` produced by a graph of more than one layer: its production is measured."""
    data = field()
    return data.copy(data=(data.data * 2.0).astype("float32"))


def test_the_input_is_measured_while_the_measuring_process_starts(user_dir, threaded, monkeypatch):
    from xarray_memchunk.models import profiling
    from xarray_memchunk.operators import cost, production

    close_kept_probe_process()  # the measuring process starts with this plan
    events = CallOrder()
    monkeypatch.setattr(ProbeProcess, "__enter__", events.watched("start", ProbeProcess.__enter__))
    monkeypatch.setattr(
        cost, "input_production", events.watched("input", production.input_production)
    )
    monkeypatch.setattr(
        self_calibration, "profile_in_worker", events.watched("block", profiling.profile_in_worker)
    )
    op = xm.BlockwiseOperator("selfcal-overlap", smooth, depth={"y": 2, "x": 2})
    plan = made_by_a_graph().memchunk.plan(op, memory_limit="2GB")
    assert any(n.startswith("memory model calibrated now") for n in plan.notes)
    assert any(n.startswith("producing one block of the input") for n in plan.notes)
    # measured once the measuring process is started, before its first block
    assert events[:3] == ["start", "input", "block"]


@pytest.mark.parametrize("doubt", [True, False])
def test_a_doubtful_half_is_measured_again_on_the_largest_block(user_dir, monkeypatch, doubt):
    from xarray_memchunk.measure.self_calibration import halved_shapes
    from xarray_memchunk.models import profiling
    from xarray_memchunk.models.fitting import ABSOLUTE_SLACK

    measured = []

    def watched(profiler, runner, cases, dtype, repeats=1):
        measured.append(dict(cases[0][0]))
        return profiling.profile_in_worker(profiler, runner, cases, dtype, repeats=repeats)

    excess = ABSOLUTE_SLACK / 2 if doubt else -1.0  # above the line within noise, or below it

    def over_the_line(operator, kwargs, grown, halved):
        return dict.fromkeys(halved, excess)

    monkeypatch.setattr(self_calibration, "profile_in_worker", watched)
    monkeypatch.setattr(self_calibration, "excess_over_linear", over_the_line)
    op = xm.BlockwiseOperator(f"selfcal-doubt-{doubt}", smooth, depth={"y": 2, "x": 2})
    data = field()
    self_calibrate(op, data, {}, 2**30)
    grown = []  # after the unmeasured warm-up block, the blocks grow until the first halved
    for extents in measured[1:]:
        if grown and np.prod(list(extents.values())) <= np.prod(list(grown[-1].values())):
            break
        grown.append(extents)
    before, largest = grown[-2], grown[-1]
    assert all(h in measured for h in halved_shapes(before, []).values())
    halved_largest = [h in measured for h in halved_shapes(largest, []).values()]
    assert all(halved_largest) if doubt else not any(halved_largest)


def test_a_second_plan_measures_in_the_process_the_first_started(user_dir, threaded, monkeypatch):
    close_kept_probe_process()
    events = CallOrder()
    monkeypatch.setattr(ProbeProcess, "__enter__", events.watched("start", ProbeProcess.__enter__))
    data = field()
    smoothed = xm.BlockwiseOperator("selfcal-kept", smooth, depth={"y": 2, "x": 2})
    squared = xm.BlockwiseOperator("selfcal-kept-square", np.square)
    for op in (smoothed, squared):
        plan = data.memchunk.plan(op, memory_limit="2GB")
        assert any(n.startswith("memory model calibrated now") for n in plan.notes)
    wider = data.memchunk.plan(smoothed, memory_limit="2GB", chunks=None)  # calibrated: no start
    assert wider.chunks
    assert events.count("start") == 1


def test_the_input_is_measured_while_a_kept_process_measures_the_blocks(user_dir, monkeypatch):
    import time

    from xarray_memchunk.models import profiling

    close_kept_probe_process()
    data = field()
    self_calibrate(xm.BlockwiseOperator("selfcal-first", np.square), data, {}, 2**30)
    blocks = []

    def watched(*args, **kwargs):
        blocks.append(time.monotonic())
        return profiling.profile_in_worker(*args, **kwargs)

    monkeypatch.setattr(self_calibration, "profile_in_worker", watched)
    slept = []

    def meanwhile():
        slept.append(time.monotonic())
        time.sleep(2)
        slept.append(time.monotonic())

    op = xm.BlockwiseOperator("selfcal-beside", smooth, depth={"y": 2, "x": 2})
    self_calibrate(op, data, {}, 2**30, meanwhile=meanwhile)
    began, ended = slept
    assert began < blocks[0] < ended  # the kept process measured while the input was
    # a block's request pickled here with 24 MB of coordinates: the blocks wait for it
    blocks.clear(), slept.clear()
    heavy = data.assign_coords(weight=(("y", "x"), np.ones(data.shape, dtype="float64") / 10))
    op = xm.BlockwiseOperator("selfcal-after", smooth, depth={"y": 2, "x": 2})
    self_calibrate(op, heavy, {}, 2**30, meanwhile=meanwhile)
    began, ended = slept
    assert ended < blocks[0]


def test_the_calibration_clock_leaves_out_what_runs_meanwhile(user_dir):
    import time

    from distributed import Client, LocalCluster

    op = xm.BlockwiseOperator("selfcal-meanwhile", smooth, depth={"y": 2, "x": 2})
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        started = time.perf_counter()
        measured = self_calibrate(
            op, field(), {}, 2**30, client=client, meanwhile=lambda: time.sleep(2)
        )
        took = time.perf_counter() - started
    assert took - measured.seconds >= 2.0  # its worker is this process: ready all along


def test_a_cluster_worker_starts_on_its_imports_while_the_input_is_measured(user_dir, monkeypatch):
    from distributed import Client, LocalCluster

    from xarray_memchunk.operators import cost, production

    events = CallOrder()
    monkeypatch.setattr(
        cost, "input_production", events.watched("input", production.input_production)
    )
    monkeypatch.setattr(
        self_calibration, "_readiness", events.watched("sent", self_calibration._readiness)
    )
    op = xm.BlockwiseOperator("selfcal-overlap-cluster", smooth, depth={"y": 2, "x": 2})
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster),
    ):
        plan = made_by_a_graph().memchunk.plan(op)
    assert any(n.startswith("memory model calibrated now") for n in plan.notes)
    assert events[:2] == ["sent", "input"]  # the worker's first call went out first


def test_a_function_on_float16_data_is_measured_on_float16_blocks(user_dir, threaded):
    """Review: NumPy's generator makes no float16, and measuring such a function failed."""
    op = xm.BlockwiseOperator("selfcal-half", lambda block: block * 2)
    data = field((400, 300), (100, 300)).astype("float16")
    plan = data.memchunk.plan(op, memory_limit="2GB")
    assert any(n.startswith("memory model calibrated now") for n in plan.notes)
    assert load_calibration(op.calibration, "cpu", "float16").profiles
    np.testing.assert_array_equal(data.memchunk.apply(op).values, (data * 2).values)


def test_a_large_under_prediction_on_a_small_block_is_said_to_be_within_the_fits_allowance():
    """A new user read "worst under-prediction 55.6%" (a rolling mean) as a failed model: the
    fit leaves a block up to 3% and 4 MiB below its measurement, a large share of a small one."""
    from pathlib import Path

    from xarray_memchunk.measure.self_calibration import SelfCalibration

    def note(worst: float) -> str:
        return SelfCalibration(Path("f-cpu.json"), 10, 10**6, 2 * 10**6, 1.0, 1.4, worst).explain()

    assert "worst under-prediction 55.6% (on a small block: within the 3% + 4.00 MiB" in note(55.6)
    assert "worst under-prediction 2.0%; trusted" in note(2.0)


def points_below_zero(block):
    """A float64 point cloud of the negative values: 32 B per negative element in 3-D."""
    where = np.argwhere(block < 0)
    cloud = np.column_stack([where.astype(np.float64), block[block < 0].astype(np.float64)])
    return block + cloud[:1, 0].sum().astype(block.dtype) * 0


def test_a_function_whose_memory_depends_on_the_values_is_measured_on_the_datas(user_dir):
    """A trial's function ran x3.5 its prediction (paused and killed workers) on its first plan:
    it was measured on generated values in [0, 1), where it found no negative value."""
    from xarray_memchunk.measure.calibrate import value_sample

    shape, chunks = (96, 96, 96), (48, 96, 96)
    negative = xr.DataArray(
        -1.0 - da.random.default_rng(1).random(shape, chunks=chunks, dtype="float32"),
        dims=("z", "y", "x"),
        name="v",
    )
    sample = value_sample(negative)
    assert sample is not None and 0 < sample.nbytes <= calibrate.SAMPLE_BYTES
    assert (sample < -1).all()
    op = xm.BlockwiseOperator("selfcal-points", points_below_zero)
    plan = negative.memchunk.plan(op, memory_limit="2GB")
    assert any(n.startswith("memory model calibrated now") for n in plan.notes)
    fit = load_calibration(op.calibration, "cpu", "float32")
    largest = max(fit.profiles, key=lambda p: math.prod(p["extents"].values()))
    elements = math.prod(largest["extents"].values())
    # the cloud (4 float64 per element) and argwhere's (3 int64): 56 B per element, at least
    assert largest["peak_bytes"] >= 48 * elements


@pytest.mark.parametrize(
    ("shape", "chunks"),
    [((3, 4000, 4000), (1, 4000, 4000)), ((2, 2, 900, 900), (1, 1, 900, 900)), ((7,), (7,))],
)
def test_the_sample_of_the_values_is_bounded_and_spread_over_the_middle_chunk(shape, chunks):
    """A review: thin chunks (one time step of a grid) made a sample 6-31x its bound."""
    from xarray_memchunk.measure.calibrate import SAMPLE_BYTES, value_sample

    data = xr.DataArray(da.zeros(shape, chunks=chunks, dtype="float64"))
    sample = value_sample(data)
    assert sample is not None and 0 < sample.nbytes <= SAMPLE_BYTES
    grid = np.random.default_rng(0).random((721, 1440)).astype("float32")
    grid[260:460, 500:940] = np.nan  # a continent at the centre: 8.5% of the grid
    share = np.isnan(value_sample(xr.DataArray(grid))).mean()
    assert share == pytest.approx(np.isnan(grid).mean(), abs=0.01)


def gradients_of_whole_planes(block):
    """Gradient magnitude over each whole (y, x) plane, in float64: about 45 B per input byte."""
    x = block.astype(np.float64)
    gy, gx = np.gradient(x, axis=-2), np.gradient(x, axis=-1)
    return np.sqrt(gx * gx + gy * gy).astype(np.float32)


@pytest.mark.cluster
def test_a_first_block_too_large_for_a_worker_is_measured_elsewhere(user_dir, cluster_client):
    """A new user's function of whole 2000 x 2000 planes: its smallest block needs ~180 MiB,
    and planning on workers of 300 MB paused them 5 times and killed 4 before it refused (2
    pauses, 2 deaths where it had been calibrated: the workers' first runs). Its first block
    is now measured in a child process, and a worker runs no first run it has no room for."""
    from xarray_memchunk.errors import InfeasiblePlanError
    from xarray_memchunk.testing import watch

    op = xm.operator(whole=["y", "x"])(gradients_of_whole_planes)
    planes = xr.DataArray(
        da.random.default_rng(0).random((6, 2000, 2000), chunks=(1, 2000, 2000)).astype("f4"),
        dims=("t", "y", "x"),
        name="v",
    )
    make, Client = cluster_client
    refusals = []

    def plan():
        with pytest.raises(InfeasiblePlanError) as refused:
            planes.memchunk.plan(op)
        refusals.append(refused.value.minimum_memory_limit)

    with make("300MB") as cluster, Client(cluster) as client:
        for _ in range(2):  # measured, then planned from the calibration (the first runs)
            watched = watch(client, "plan", plan)
            assert watched.completed, watched.error
            assert (watched.pauses, watched.worker_deaths) == (0, 0)
    assert len(refusals) == 2 and refusals[0] > 400 * 2**20

import json
import sys

import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.measure.calibrate import run_task
from xarray_memchunk.models.calibration import load_calibration, save_calibration, shipped_dir
from xarray_memchunk.models.fitting import UNDER_TOLERANCE, fit_linear
from xarray_memchunk.models.profiling import freeze_heap, frozen_heap, measure_peak, thaw_heap

MB = 1_000_000


def hog(block):
    """Allocates 3 more copies of its block at once: peak ~4x the block."""
    a, b, c = block * 2, block * 3, block * 4
    return a + b - c


HOG = xm.BlockwiseOperator(
    "test-hog", hog, memory_model=xm.LinearMemoryModel({"input_bytes": 1.0}), depth={"x": 1}
)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    return tmp_path


def test_profiler_sees_a_known_peak():
    # 10 M float32 = 40 MB input; hog holds input + a, b, c and a temporary: 5 x 40 MB
    extents = {"x": 10_000_000}
    peak, seconds, method = measure_peak(run_task, HOG, {}, extents, extents, "float32", 0)
    assert method in {"hwm", "sampling"}
    assert 4.5 * 40 * MB < peak < 6.5 * 40 * MB
    assert seconds > 0


def test_a_series_of_peaks_in_a_frozen_heap_sees_the_same_peak_and_thaws():
    import gc

    from xarray_memchunk.models.probe_process import ProbeProcess

    extents = {"x": 10_000_000}
    freeze_heap()
    try:
        peak, _, _ = measure_peak(run_task, HOG, {}, extents, extents, "float32", 0)
        assert gc.get_freeze_count() > 0  # a series stays frozen between its measurements
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0
    assert 4.5 * 40 * MB < peak < 6.5 * 40 * MB
    measure_peak(run_task, HOG, {}, extents, extents, "float32", 0)
    assert gc.get_freeze_count() == 0  # alone, a measurement thaws what it froze
    with ProbeProcess() as child:
        with frozen_heap(child) as held:
            assert child.submit(gc.get_freeze_count).result() > 0
            # what the series leaves held is read as it ends
            child.submit(exec, "import builtins; builtins.kept = b'1' * (100 * 2**20)").result()
        assert child.submit(gc.get_freeze_count).result() == 0
    if sys.platform == "linux":  # read from /proc/self/status
        assert held.before > 0 and 95 * MB < held.after - held.before < 120 * MB


@pytest.mark.cluster
def test_a_worker_frozen_for_a_series_is_thawed_when_a_measurement_fails():
    import gc

    from distributed import Client, LocalCluster

    from xarray_memchunk.models import profiling

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        pytest.raises(ValueError, match="a block failed"),
        frozen_heap(client),  # the worker is this process
    ):
        assert gc.get_freeze_count() > 0 and profiling._FROZEN_SERIES.is_set()
        raise ValueError("a block failed")
    assert gc.get_freeze_count() == 0 and not profiling._FROZEN_SERIES.is_set()


def test_fit_is_conservative_and_extrapolates():
    rng = np.random.default_rng(0)
    size = np.array([1e6, 2e6, 4e6, 8e6, 1.6e7])
    peaks = 12.0 * size + 5e6 + rng.normal(0, 2e5, size.shape)
    fit = fit_linear({"input_bytes": size}, peaks)
    predicted = fit.predict({"input_bytes": size})
    assert np.all(predicted >= peaks * (1 - UNDER_TOLERANCE) - 4 * 2**20)
    # 10x beyond the largest fitted task, the linear form keeps growing
    far = fit.predict({"input_bytes": np.array([1.6e8])})[0]
    assert abs(far / (12.0 * 1.6e8 + 5e6) - 1) < 0.05


def test_tiny_tasks_that_measure_zero_bytes_still_fit():
    # CI, test_rolling: a 40 x 3 x 4 array's blocks rose the resident memory by 0 bytes (their
    # pages were mapped already); 1 / peak weighed them infinitely and scikit-learn raised
    size = np.array([480.0, 960.0, 1920.0, 3840.0])
    peaks = np.array([0.0, 0.0, 0.0, 65536.0])
    fit = fit_linear({"input_bytes": size}, peaks)
    values = [fit.intercept, *fit.coefficients.values(), fit.median_abs_pct_error]
    assert np.all(np.isfinite([*values, fit.worst_under_pct, fit.worst_over_pct]))
    assert np.all(fit.predict({"input_bytes": size}) >= peaks * (1 - UNDER_TOLERANCE) - 4 * 2**20)


def test_tree_model_would_not_extrapolate_but_ours_does():
    # the seed's failure: a tree ensemble stays flat past its training range
    from sklearn.ensemble import RandomForestRegressor

    size = np.linspace(1e6, 8e6, 8)
    peaks = 240.0 * size
    tree = RandomForestRegressor(n_estimators=20, random_state=0).fit(size[:, None], peaks)
    ten_x = np.array([[8e7]])
    assert tree.predict(ten_x)[0] < 0.2 * 240 * 8e7
    assert fit_linear({"n": size}, peaks).predict({"n": ten_x[0]})[0] >= 0.97 * 240 * 8e7


def test_json_round_trip_and_user_precedence(user_dir):
    shipped = load_calibration("gst3d", "cpu", "float32")
    assert shipped is not None and str(shipped_dir()) in shipped.path
    fits = {
        "float32": {
            "coefficients": {"input_bytes": 99.0, "output_bytes": 0.0},
            "intercept": 1.0,
            "seconds_per_element": 1e-7,
            "fit": {},
        }
    }
    path = save_calibration("gst3d", "cpu", fits, {"created": "test"})
    assert path.parent == user_dir
    json.loads(path.read_text())  # plain JSON: loading it runs no code
    mine = load_calibration("gst3d", "cpu", "float32")
    assert mine.model.coefficients["input_bytes"] == 99.0 and mine.path == str(path)
    # float64 is not in the user file: the shipped fit is used
    assert str(shipped_dir()) in load_calibration("gst3d", "cpu", "float64").path


def test_notes_name_the_calibration_and_whose_it_is_not_its_full_path(tmp_path, monkeypatch):
    """Issue 33: the notes printed the calibration's absolute path inside the environment."""
    volume = xr.DataArray(np.zeros((40, 40, 40), "float32"), dims=("inline", "crossline", "sample"))
    shipped = volume.memchunk.plan("gst3d", memory_limit="1GB").notes
    assert "memory model: shipped calibration gst3d-cpu.json" in shipped
    assert not any(str(shipped_dir()) in note for note in shipped)
    # the user's, under the home directory: the home written ~
    monkeypatch.setenv("HOME", str(tmp_path))
    mine = tmp_path / ".local" / "share" / "xarray-memchunk" / "calibrations"
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(mine))
    fits = {
        "float32": {
            "coefficients": {"input_bytes": 99.0, "output_bytes": 0.0},
            "intercept": 1.0,
            "seconds_per_element": 1e-7,
            "fit": {},
        }
    }
    save_calibration("gst3d", "cpu", fits, {"created": "test"})
    notes = volume.memchunk.plan("gst3d", memory_limit="1GB").notes
    expected = "your calibration ~/.local/share/xarray-memchunk/calibrations/gst3d-cpu.json"
    assert f"memory model: {expected}" in notes
    assert not any(str(tmp_path) in note for note in notes)


def test_malformed_calibration_is_a_clear_error(user_dir):
    (user_dir / "gst3d-cpu.json").write_text("{not json")
    with pytest.raises(xm.CalibrationError, match="cannot read calibration"):
        load_calibration("gst3d", "cpu", "float32")
    (user_dir / "gst3d-cpu.json").write_text(json.dumps({"format": "pickle?"}))
    with pytest.raises(xm.CalibrationError, match="not an xarray-memchunk calibration"):
        load_calibration("gst3d", "cpu", "float32")


def test_every_builtin_operator_plans_with_fitted_coefficients():
    for name in ["sum", "mean", "std", "var", "min", "max", "median", "quantile"]:
        calibration = load_calibration(name, "cpu", "float32")
        assert calibration is not None, name
        assert calibration.metadata["fit"]["n_profiles"] >= 8
    for key in ["gst3d", "gst3d-d2geo", "svd", "svd-compressed"]:
        assert load_calibration(key, "cpu", "float64") is not None, key
    volume = xr.DataArray(np.zeros((40, 40, 40), "float32"), dims=("inline", "crossline", "sample"))
    assert any("calibration" in n for n in volume.memchunk.plan("gst3d").notes)


@pytest.mark.cluster
def test_calibrate_custom_operator_end_to_end(user_dir):
    xm.register_operator(HOG, overwrite=True)
    shapes = [{"x": n} for n in (250_000, 500_000, 1_000_000, 2_000_000, 4_000_000)]
    fits = xm.calibrate("test-hog", dtypes=("float32",), shapes=shapes, repeats=1)
    coef = fits["float32"]["coefficients"]
    # ~5 bytes of peak per input byte (input, three copies, one temporary)
    assert 4.0 < coef["input_bytes"] + coef["output_bytes"] < 6.5
    plan = xr.DataArray(np.zeros(8_000_000, "float32"), dims="x").memchunk.plan(
        "test-hog", memory_limit="2GB"
    )
    assert any(str(user_dir) in note for note in plan.notes)


def test_the_measuring_worker_is_asked_of_the_scheduler_not_the_cached_identity():
    """A self-calibrating plan raised StopIteration: the client's cached identity listed no
    worker on a cluster whose two workers were running."""
    from xarray_memchunk.models.profiling import _workers

    class Cached:
        def scheduler_info(self, **kwargs):
            return {"workers": {}}

        def ncores(self):
            return {"tcp://127.0.0.1:4000": 1}

    assert _workers(Cached()) == ["tcp://127.0.0.1:4000"]

"""Calibration files and their directory: schema validation, safe names, safe writes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate
from xarray_memchunk.models.calibration import (
    load_calibration,
    save_calibration,
    shipped_dir,
    writable_calibration_dir,
)

MEMCHUNK = [sys.executable, "-m", "xarray_memchunk.cli"]
SHIPPED_MEAN = json.loads((shipped_dir() / "mean-cpu.json").read_text())
FIT = {
    "coefficients": {"input_bytes": 3.0, "output_bytes": 1.0},
    "intercept": 1e6,
    "seconds_per_element": 1e-8,
    "fit": {},
}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    directory = tmp_path / "calibrations"
    directory.mkdir()
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(directory))
    return directory


def plan_mean():
    data = xr.DataArray(np.zeros((100, 50), "float32"), dims=("time", "x")).chunk({"time": 10})
    return data.memchunk.plan("mean", dim="time", memory_limit="1GB")


def mean_file(**fit_changes):
    """The shipped mean calibration as JSON text, its float32 fit changed."""
    document = json.loads(json.dumps(SHIPPED_MEAN))
    document["fits"]["float32"] |= fit_changes
    return json.dumps(document)


def coefficient(value):
    return mean_file(coefficients=SHIPPED_MEAN["fits"]["float32"]["coefficients"] | value)


def intercept_literal(literal):
    """The shipped mean calibration with a float32 intercept written as ``literal``."""
    return mean_file(intercept=0.0).replace('"intercept": 0.0', f'"intercept": {literal}')


def document_with(**changes):
    return json.dumps(SHIPPED_MEAN | changes)


BAD_FILES = {
    "negative coefficient": (coefficient({"input_bytes": -2.0}), "must be a finite number >= 0"),
    "negative intercept": (mean_file(intercept=-4e8), "'intercept'.* must be a finite number"),
    "NaN": (intercept_literal("NaN"), "nan"),
    "Infinity": (intercept_literal("Infinity"), "inf"),
    "1e400": (intercept_literal("1e400"), "inf"),
    "huge integer": (mean_file(intercept=10**300 * 10**100), "must be a finite number"),
    "string": (mean_file(seconds_per_element="1e-8"), "must be a number, not str"),
    "list": (coefficient({"input_bytes": [1.0]}), "must be a number, not list"),
    "dict": (mean_file(intercept={"bytes": 1}), "must be a number, not dict"),
    "boolean": (coefficient({"input_bytes": True}), "must be a number, not bool"),
    "coefficients a list": (mean_file(coefficients=[1.0, 2.0]), "must be an object, not list"),
    "missing intercept": (
        json.dumps(
            SHIPPED_MEAN | {"fits": {"float32": {"coefficients": {}, "seconds_per_element": 1e-8}}}
        ),
        "lacks 'intercept'",
    ),
    "fits a list": (document_with(fits=[1]), "'fits' must be an object"),
    "fit figures a list": (mean_file(fit=[1]), r"\['fit'\] must be an object"),
    "profiles a number": (mean_file(profiles=5), r"\['profiles'\] must be a list"),
    "work per element 0": (
        mean_file(fit={"work_per_element": 0}),
        r"\['work_per_element'\] must be above 0",
    ),
    "work per element NaN": (
        mean_file(fit={"work_per_element": 1.0}).replace(
            '"work_per_element": 1.0', '"work_per_element": NaN'
        ),
        r"\['work_per_element'\] must be a finite number >= 0, not nan",
    ),
    "resident memory a string": (
        mean_file(fit={"resident_after_bytes": "2e8"}),
        r"\['resident_after_bytes'\] must be a number, not str",
    ),
    "missing operator": (
        json.dumps({k: v for k, v in SHIPPED_MEAN.items() if k != "operator"}),
        "lacks 'operator'",
    ),
    "another operator": (document_with(operator="gst3d"), "is for operator 'gst3d', not 'mean'"),
    "another device": (document_with(device="gpu"), "is for device 'gpu', not 'cpu'"),
    "nested 100,000 deep": (
        json.dumps(SHIPPED_MEAN)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("text, problem", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_calibration_file_is_a_clear_error_before_planning(user_dir, text, problem):
    path = user_dir / "mean-cpu.json"
    path.write_text(text)
    with pytest.raises(xm.CalibrationError, match=re.escape(str(path)) + ".*" + problem) as info:
        plan_mean()
    assert "delete" in str(info.value) and "memchunk calibrate" in str(info.value)


def test_calibration_with_a_feature_the_operator_lacks_is_refused(user_dir):
    (user_dir / "mean-cpu.json").write_text(coefficient({"bogus_bytes": 1.0}))
    with pytest.raises(xm.CalibrationError, match=r"needs features \['bogus_bytes'\]"):
        plan_mean()


@pytest.mark.parametrize(
    "coefficients, intercept",
    [({"input_bytes": -1.0}, 0.0), ({"input_bytes": 1.0}, -1.0), ({"x": float("nan")}, 0.0)],
)
def test_memory_model_refuses_terms_that_predict_a_negative_peak(coefficients, intercept):
    with pytest.raises(xm.CalibrationError, match="must be a finite number >= 0"):
        xm.LinearMemoryModel(coefficients, intercept=intercept)


def test_feature_names_that_are_not_strings_are_refused(user_dir):
    with pytest.raises(xm.CalibrationError, match="feature names are strings, got 1"):
        xm.LinearMemoryModel({1: 2.0})
    fit = FIT | {"coefficients": {1: 2.0}}
    with pytest.raises(xm.CalibrationError, match="has a name that is not a string: int 1"):
        save_calibration("mean", "cpu", {"float32": fit}, {})
    assert list(user_dir.iterdir()) == []


def test_every_shipped_calibration_passes_the_schema(user_dir):
    for path in sorted(shipped_dir().glob("*.json")):
        operator, device = path.stem.rsplit("-", 1)
        for dtype in ("float32", "float64"):
            assert load_calibration(operator, device, dtype).path == str(path)


@pytest.fixture(scope="module")
def tas_nc(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tas.nc"
    synthetic_climate(120, 18, 24).to_netcdf(path)
    return path


@pytest.mark.parametrize("name", ["negative coefficient", "nested 100,000 deep"])
def test_cli_bad_calibration_file_exits_2_with_one_line(user_dir, tas_nc, name):
    path = user_dir / "mean-cpu.json"
    path.write_text(BAD_FILES[name][0])
    command = [*MEMCHUNK, "plan", "mean", str(tas_nc), "--dim", "T", "--memory-limit", "1GB"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(path) in result.stderr


def test_invalid_file_is_replaced_by_a_new_calibration(user_dir):
    (user_dir / "mean-cpu.json").write_text("{not json")
    path = save_calibration("mean", "cpu", {"float32": FIT}, {"created": "test"})
    assert load_calibration("mean", "cpu", "float32").model.intercept == 1e6
    assert json.loads(path.read_text())["operator"] == "mean"


def test_invalid_fit_is_not_written(user_dir):
    with pytest.raises(xm.CalibrationError, match=r"not writing calibration.*intercept"):
        save_calibration("mean", "cpu", {"float32": FIT | {"intercept": float("nan")}}, {})
    assert list(user_dir.iterdir()) == []


@pytest.mark.parametrize("name", ["smooth/3x3", "../../escape", "a b:c?", ".hidden", "x" * 300])
def test_operator_names_map_to_files_inside_the_directory(user_dir, name):
    path = save_calibration(name, "cpu", {"float32": FIT}, {})
    assert path.parent == user_dir and path.is_file()
    assert load_calibration(name, "cpu", "float32").path == str(path)
    assert [p.name for p in user_dir.parent.rglob("*") if p.is_file()] == [path.name]


def test_distinct_names_keep_distinct_files(user_dir):
    names = ["smooth/3x3", "smooth_3x3", "smooth?3x3", "smooth:3x3"]
    paths = {save_calibration(n, "cpu", {"float32": FIT}, {}) for n in names}
    assert len(paths) == len(names)
    assert load_calibration("smooth_3x3", "cpu", "float32").path == str(
        user_dir / "smooth_3x3-cpu.json"
    )


def test_failed_write_leaves_no_temporary_file(user_dir):
    (user_dir / "mean-cpu.json").mkdir()  # the replace fails: a directory is in the way
    with pytest.raises(xm.CalibrationError, match="cannot write calibration"):
        save_calibration("mean", "cpu", {"float32": FIT}, {})
    unserializable = {"created": object()}  # json.dump fails half-way
    with pytest.raises(TypeError):
        save_calibration("std", "cpu", {"float32": FIT}, unserializable)
    assert sorted(p.name for p in user_dir.iterdir()) == ["mean-cpu.json"]


UNWRITABLE = ["a regular file", "under a regular file", "/sys"]


def unwritable(tmp_path, kind):
    """A directory that cannot be created or written, even by root."""
    if kind == "/sys":
        if not Path("/sys").is_dir():
            pytest.skip("no /sys on this system")
        return Path("/sys/memchunk-calibrations")
    regular = tmp_path / "a-file"
    regular.write_text("not a directory\n")
    return regular if kind == "a regular file" else regular / "calibrations"


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_unwritable_directory_is_named_with_what_to_set(tmp_path, monkeypatch, kind):
    directory = unwritable(tmp_path, kind)
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(directory))
    with pytest.raises(xm.CalibrationError) as info:
        writable_calibration_dir()
    message = str(info.value)
    assert message.startswith(f"cannot write calibrations in {directory}: ")
    assert "MEMCHUNK_CALIBRATION_DIR" in message and "memchunk.calibration-dir" in message


def test_writable_directory_is_created_and_left_clean(tmp_path):
    directory = writable_calibration_dir(tmp_path / "new" / "calibrations")
    assert directory.is_dir() and list(directory.iterdir()) == []


class NoProfiling:
    """A client that fails the test if calibration starts profiling."""

    def __getattr__(self, name):
        raise AssertionError(f"calibration profiled (client.{name}) before checking the directory")


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_calibrate_checks_the_directory_before_profiling(tmp_path, monkeypatch, kind):
    directory = unwritable(tmp_path, kind)
    with pytest.raises(xm.CalibrationError, match="pass a writable directory"):
        xm.calibrate("mean", dtypes=("float32",), client=NoProfiling(), directory=directory)
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(directory))
    with pytest.raises(xm.CalibrationError, match="MEMCHUNK_CALIBRATION_DIR"):
        xm.calibrate("mean", dtypes=("float32",), client=NoProfiling())


def test_cli_calibrate_output_dir_that_is_a_file_exits_2_at_once(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("not a directory\n")
    command = [*MEMCHUNK, "calibrate", "mean", "--dtype", "float32", "--repeats", "1"]
    result = subprocess.run(
        [*command, "--output-dir", str(regular)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"cannot write calibrations in {regular}" in result.stderr


def hog(block):
    """Allocates 3 more copies of its block at once: peak ~4x the block."""
    a, b, c = block * 2, block * 3, block * 4
    return a + b - c


@pytest.mark.cluster
def test_calibrate_operator_named_like_a_path(user_dir):
    op = xm.BlockwiseOperator(
        "smooth/3x3", hog, memory_model=xm.LinearMemoryModel({"input_bytes": 1.0})
    )
    xm.register_operator(op, overwrite=True)
    shapes = [{"x": n} for n in (250_000, 500_000, 1_000_000, 2_000_000)]
    xm.calibrate("smooth/3x3", dtypes=("float32",), shapes=shapes, repeats=1)
    (written,) = user_dir.iterdir()
    assert written.name.startswith("smooth_3x3-") and written.suffix == ".json"
    plan = xr.DataArray(np.zeros(4_000_000, "float32"), dims="x").memchunk.plan(
        "smooth/3x3", memory_limit="2GB"
    )
    assert any(str(written) in note for note in plan.notes)
    assert os.listdir(user_dir) == [written.name]  # no temporary file left


def test_calibration_files_are_written_readable_by_all_not_private(tmp_path):
    import os
    import stat

    from xarray_memchunk.models.calibration import write_json_atomically

    umask = os.umask(0o022)
    try:
        target = tmp_path / "x-cpu.json"
        write_json_atomically({"a": 1}, target)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # mkstemp's 0o600 before

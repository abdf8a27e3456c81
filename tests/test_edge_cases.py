"""Every edge case gets the right answer or a clear error before compute (issue 12).

Each table below lists cases with the behaviour expected of them: the API's (a
``MemchunkError`` of the right type before anything is computed, or a correct result), GST3D's
numerics (scale invariance, NaN semantics), Datasets as xarray has them, the command line's
(exit status 2, one line on stderr, no traceback, checked before a cluster starts), and writes
interrupted at their worst moment.
"""

import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import dask
import dask.array
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic
from xarray_memchunk.io import RecoveredWriteWarning, recover, safe_write
from xarray_memchunk.operators.gst3d.kernels import halo_depth

MEMCHUNK = [sys.executable, "-m", "xarray_memchunk.cli"]
SPATIAL = ("inline", "crossline", "sample")


def volume(shape, dtype="float32"):
    return xr.DataArray(np.random.default_rng(0).random(shape).astype(dtype), dims=SPATIAL)


def field(n_time=50, n_x=8, dtype="float64"):
    rng = np.random.default_rng(1)
    return xr.DataArray(rng.random((n_time, n_x)).astype(dtype), dims=("time", "x"), name="f")


# --- the API: a clear error before compute --------------------------------------------------

REFUSED = [
    (
        "budget below the idle worker",
        lambda: field().memchunk.plan("mean", memory_limit="150MB"),
        xm.BudgetError,
        r"no room for a task.*at least",
    ),
    (
        "budget NaN",
        lambda: field().memchunk.plan("mean", memory_limit=float("nan")),
        xm.BudgetError,
        "finite",
    ),
    (
        "budget infinite",
        lambda: field().memchunk.plan("mean", memory_limit=float("inf")),
        xm.BudgetError,
        "finite",
    ),
    (
        "budget 1e400",
        lambda: field().memchunk.plan("mean", memory_limit="1e400"),
        xm.BudgetError,
        "cannot parse",
    ),
    (
        "gst3d on a dim of length 0",
        lambda: volume((20, 20, 0)).memchunk.plan("gst3d"),
        xm.DimensionError,
        "'sample' has length 0",
    ),
    (
        "svd of an empty matrix",
        lambda: field(0).memchunk.plan("svd", sample_dims="time", k=2),
        xm.DimensionError,
        "'time' has length 0",
    ),
    (
        "reduction over an empty dim",
        lambda: field(0).memchunk.plan("mean", dim="time"),
        xm.DimensionError,
        "'time' has length 0",
    ),
    (
        "chunks zero",
        lambda: volume((40, 40, 40)).memchunk.plan("gst3d", chunks={"inline": 0}),
        xm.MemchunkError,
        "positive length",
    ),
    (
        "chunks negative",
        lambda: volume((40, 40, 40)).memchunk.plan("gst3d", chunks={"inline": -5}),
        xm.MemchunkError,
        "positive length",
    ),
    (
        "chunks not ints",
        lambda: volume((40, 40, 40)).memchunk.plan("gst3d", chunks={"inline": 2.5}),
        xm.MemchunkError,
        "positive length",
    ),
    (
        "quantile q above 1",
        lambda: field().memchunk.plan("quantile", q=1.5, dim="time"),
        xm.MemchunkError,
        r"within \[0, 1\]",
    ),
    (
        "quantile q NaN",
        lambda: field().memchunk.plan("quantile", q=float("nan"), dim="time"),
        xm.MemchunkError,
        r"within \[0, 1\]",
    ),
    (
        "quantile q empty",
        lambda: field().memchunk.plan("quantile", q=[], dim="time"),
        xm.MemchunkError,
        "non-empty",
    ),
    (
        "quantile q text",
        lambda: field().memchunk.plan("quantile", q="abc", dim="time"),
        xm.MemchunkError,
        "number or a list",
    ),
    (
        "quantile method unknown",
        lambda: field().memchunk.plan("quantile", q=0.5, method="bogus", dim="time"),
        xm.MemchunkError,
        "method must be one of",
    ),
    (
        "svd k above the matrix",
        lambda: field().memchunk.plan("svd", sample_dims="time", k=20, method="compressed"),
        xm.MemchunkError,
        "k=20 asks for more components than the 8",
    ),
    (
        "svd of float16",
        lambda: field(dtype="float16").memchunk.plan("svd", sample_dims="time"),
        xm.MemchunkError,
        "float32 or float64, not float16",
    ),
    (
        "svd of integers",
        lambda: field(dtype="int32").memchunk.plan("svd", sample_dims="time"),
        xm.MemchunkError,
        "astype",
    ),
    (
        "svd n_power_iter text",
        lambda: field().memchunk.plan("svd", sample_dims="time", k=2, n_power_iter="x"),
        xm.MemchunkError,
        "n_power_iter must be an int",
    ),
    (
        "gst3d sigma text",
        lambda: volume((20, 20, 20)).memchunk.plan("gst3d", sigma="abc"),
        xm.MemchunkError,
        "sigma must be a number",
    ),
    (
        "gst3d output dtype unknown",
        lambda: volume((20, 20, 20)).memchunk.plan("gst3d", dtype="foo"),
        xm.MemchunkError,
        "float dtype",
    ),
    (
        "std ddof negative",
        lambda: field().memchunk.plan("std", dim="time", ddof=-1),
        xm.MemchunkError,
        "ddof must be an int >= 0",
    ),
    (
        "dims that are not strings",
        lambda: xr.DataArray(np.zeros((4, 5)), dims=(0, 1)).memchunk.plan("mean", dim=0),
        xm.DimensionError,
        "named by strings",
    ),
    (
        "gst3d on text",
        lambda: xr.DataArray(np.array([["a"]]), dims=("x", "y")).memchunk.plan("gst3d"),
        xm.MemchunkError,
        "which memchunk does not plan",
    ),
    # issue 27 item 9
    (
        "quantile of bool",
        lambda: (field() > 0.5).memchunk.plan("quantile", q=0.5, dim="time"),
        xm.MemchunkError,
        "quantile does not compute on dtype bool",
    ),
    (
        "quantile of complex",
        lambda: (field() + 1j).memchunk.plan("quantile", q=0.5, dim="time"),
        xm.MemchunkError,
        "quantile does not compute on dtype complex128",
    ),
    (
        "duplicate dims",
        lambda: xr.DataArray(np.zeros((4, 4)), dims=("x", "x")).chunk().memchunk.apply("mean"),
        xm.DimensionError,
        r"the DataArray has dims \('x', 'x'\), one name twice",
    ),
    (
        "duplicate dims in a Dataset's variable",
        lambda: xr.Dataset({"a": (("x", "x"), np.zeros((4, 4)))}).memchunk.apply("median", dim="x"),
        xm.DimensionError,
        r"variable 'a' has dims \('x', 'x'\), one name twice",
    ),
    (
        "gst3d sigma=1e308",
        lambda: volume((24, 20, 18)).memchunk.plan("gst3d", sigma=1e308),
        xm.MemchunkError,
        r"sigma=1e\+308.*infinite radius.*'inline' \(24 voxels\).*use sigma <= 8 with",
    ),
    (
        "gst3d truncate=1e9",
        lambda: volume((24, 20, 18)).memchunk.plan("gst3d", truncate=1e9),
        xm.MemchunkError,
        r"radius of 1,000,000,000 voxels.*'inline' \(24 voxels\).*use truncate <= 24 ",
    ),
    (
        "gst3d truncate=1e6",
        lambda: volume((24, 20, 18)).memchunk.plan("gst3d", truncate=1e6),
        xm.MemchunkError,
        r"radius of 1,000,000 voxels.*'inline' \(24 voxels\).*use truncate <= 24 ",
    ),
    (
        "gst3d rho longer than the volume",
        lambda: volume((24, 20, 18)).memchunk.plan("gst3d", rho=9.0),
        xm.MemchunkError,
        r"rho=9.*radius of 27 voxels.*use truncate <= 2.66 ",
    ),
    (
        # it failed in the rechunk with KeyError "No variable named '1'" (plans are keyed by
        # the name); a variable left out of the plan may keep such a name
        "a planned variable named by an int",
        lambda: xr.Dataset({1: field(), "t": field()}).memchunk.apply("mean"),
        xm.MemchunkError,
        r"variable 1 of the Dataset is not named by a string \(its name is of type int\).*"
        r"ds.rename_vars\(\{1: '1'\}\)",
    ),
    (
        "gst3d of float128",
        lambda: volume((24, 20, 18), np.longdouble).memchunk.plan("gst3d"),
        xm.MemchunkError,
        "float32 or float64 and its kernels take no float128",
    ),
]

OPERATORS = [
    ("sum", {}),
    ("mean", {}),
    ("std", {}),
    ("var", {}),
    ("min", {}),
    ("max", {}),
    ("median", {}),
    ("quantile", {"q": 0.5}),
    ("gst3d", {}),
    ("svd", {"sample_dims": "time"}),
]


@pytest.mark.parametrize(("case", "call", "error", "match"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_before_compute(case, call, error, match):
    calls = []
    with dask.config.set(scheduler=lambda *a, **k: calls.append(1)):
        with pytest.raises(error, match=match):
            call()
    assert calls == []  # nothing was computed


@pytest.mark.parametrize(("op", "kwargs"), OPERATORS, ids=[o for o, _ in OPERATORS])
@pytest.mark.parametrize("kind", ["DataArray", "Dataset"])
def test_0d_data_is_refused_by_every_operator(op, kwargs, kind):
    data = xr.DataArray(3.5, name="t")
    data = data.to_dataset() if kind == "Dataset" else data
    for call in (data.memchunk.plan, data.memchunk.apply):
        with pytest.raises(xm.DimensionError, match=f"0-d.*nothing to chunk for '{op}'"):
            call(op, memory_limit="1GB", **kwargs)


@pytest.mark.parametrize(("op", "kwargs"), OPERATORS[:8], ids=[o for o, _ in OPERATORS[:8]])
def test_0d_variables_of_a_dataset_are_reduced_as_xarray_does(op, kwargs, threaded):
    ds = xr.Dataset({"scalar": xr.DataArray(3.5), "series": ("time", np.arange(10.0))})
    result = ds.chunk().memchunk.apply(op, memory_limit="1GB", **kwargs).compute()
    xr.testing.assert_identical(result, getattr(ds, op)(*kwargs.values()))


@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_gst3d_of_float16_computes_in_float32(kernel, threaded):
    data = volume((40, 36, 32)).astype("float16")
    out = data.chunk({"inline": 20}).memchunk.apply(
        "gst3d", chunks={"inline": 20}, memory_limit="1GB", kernel=kernel
    )
    assert out.dtype == np.float32
    expected = data.astype("float32").memchunk.apply("gst3d", kernel=kernel)
    np.testing.assert_array_equal(out.values, expected.values)


@pytest.mark.parametrize("options", [{}, {"method": "compressed", "k": 3}, {"tsqr": "two-pass"}])
def test_svd_along_a_multiindex_dim_keeps_the_index(options, threaded):
    climate = synthetic_climate(40, 6, 8, chunks={"time": 10})
    stacked = climate.tas.stack(space=("lat", "lon"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        result = stacked.memchunk.apply(
            "svd", sample_dims="time", memory_limit="1GB", **options
        ).compute()
    plain = stacked.reset_index("space").drop_vars(["lat", "lon"])
    expected = plain.memchunk.apply("svd", sample_dims="time", memory_limit="1GB", **options)
    np.testing.assert_allclose(result.S, expected.S, rtol=1e-5)
    np.testing.assert_allclose(np.abs(result.V), np.abs(expected.V), atol=1e-5)
    assert result.V.dims == ("mode", "space") and result.U.dims == ("time", "mode")
    assert result.indexes["space"].equals(stacked.indexes["space"])
    xr.testing.assert_identical(result.lat, stacked.lat)


def test_svd_of_nan_is_a_clear_error_when_computed(threaded):
    data = field()
    data[3, 3] = np.nan
    result = data.memchunk.apply("svd", sample_dims="time", memory_limit="1GB")
    with pytest.raises(xm.MemchunkError, match="NaN or infinite values"):
        result.compute()  # NaNs are only known once the data is read


def test_plan_explains_every_size_in_one_unit_convention():
    """Issue 33: binary units, as Dask prints them; a decimal limit is converted once."""
    decimal = field().memchunk.plan("mean", dim="time", memory_limit="1GB").explain()
    assert "953.67 MiB memory_limit" in decimal and "memory_limit 1 GB = 953.67 MiB" in decimal
    assert not re.search(r"\d (kB|MB|GB|TB)\b", decimal.replace("memory_limit 1 GB", ""))
    binary = field().memchunk.plan("mean", dim="time", memory_limit="1GiB").explain()
    assert "1,024.00 MiB memory_limit" in binary or "1.00 GiB memory_limit" in binary
    assert not re.search(r"\d (kB|MB|GB|TB)\b", binary)
    # the percentage of the budget is true arithmetic
    plan = field().memchunk.plan("mean", dim="time", memory_limit="1GB")
    assert f"({100 * plan.predicted_peak_bytes / plan.budget.per_task:.0f}% of budget" in (
        plan.explain()
    )


@pytest.mark.parametrize("length", [1, 5])
def test_gst3d_on_a_dim_shorter_than_its_halo_runs_whole(length, threaded):
    data = volume((40, 30, length))
    plan = data.memchunk.plan("gst3d", memory_limit="1GB")
    assert plan.dask_chunks["sample"] == (length,)
    assert halo_depth("gaussian", 1.0, 2.0, 3.0) > length
    out = data.chunk({"inline": 20}).memchunk.apply("gst3d", memory_limit="1GB").values
    np.testing.assert_array_equal(out, data.memchunk.apply("gst3d").values)


def test_chunks_shorter_than_the_halo_are_merged_and_the_plan_says_so(threaded):
    data = volume((60, 60, 60))
    plan = data.memchunk.plan("gst3d", chunks={"inline": 19}, memory_limit="1GB")
    assert min(plan.dask_chunks["inline"]) >= 9 and sum(plan.dask_chunks["inline"]) == 60
    assert any("shorter than its halo of 9, merged" in n for n in plan.notes)
    out = data.memchunk.apply("gst3d", chunks={"inline": 19}, memory_limit="1GB")
    assert out.chunks[0] == plan.dask_chunks["inline"]  # what runs is what was planned
    np.testing.assert_array_equal(out.values, data.memchunk.apply("gst3d").values)


def test_chunks_longer_than_the_dim_are_the_dim():
    plan = volume((40, 30, 20)).memchunk.plan("gst3d", chunks={"inline": 300}, memory_limit="1GB")
    assert plan.dask_chunks["inline"] == (40,)


# --- GST3D numerics: scale invariance, NaNs ---------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_gst3d_does_not_depend_on_the_amplitude_scale(dtype, kernel, threaded):
    amplitude = synthetic_seismic(
        (40, 36, 32), dip_degrees=25, azimuth_degrees=60, noise=0.3, dtype=dtype
    ).amplitude
    reference = {
        a: amplitude.memchunk.apply("gst3d", kernel=kernel, attribute=a, dtype="float64").values
        for a in ("dip", "azimuth")
    }
    steep = reference["dip"] > 5  # azimuth of a flat reflector is undefined
    for scale in (1e-12, 1e-8, 1e-5, 1e5, 1e12):
        scaled = (amplitude * scale).astype(dtype)
        dip = scaled.memchunk.apply("gst3d", kernel=kernel, dtype="float64").values
        azimuth = scaled.memchunk.apply(
            "gst3d", kernel=kernel, attribute="azimuth", dtype="float64"
        ).values
        assert np.abs(dip - reference["dip"]).max() < 1e-3, scale
        turn = np.abs((azimuth - reference["azimuth"] + 180) % 360 - 180)
        assert turn[steep].max() < 1e-2, scale


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
def test_gst3d_nan_reaches_exactly_its_halo_whatever_the_chunking(dtype, kernel, threaded):
    amplitude = synthetic_seismic((48, 44, 40), noise=0.2, dtype=dtype).amplitude.copy()
    amplitude[24, 22, 20] = np.nan
    whole = amplitude.memchunk.apply("gst3d", kernel=kernel).values
    depth = halo_depth(kernel, 1.0, 2.0, 3.0)
    assert np.isnan(whole).sum() == (2 * depth + 1) ** 3  # the cube of the halo, no further
    for chunks in ({"inline": 24, "crossline": 22, "sample": 20}, {"inline": 10, "sample": 40}):
        chunked = amplitude.chunk(8).memchunk.apply("gst3d", kernel=kernel, chunks=chunks).values
        np.testing.assert_array_equal(chunked, whole)  # NaNs included


# --- Datasets as xarray has them --------------------------------------------------------------


@pytest.fixture
def mixed():
    rng = np.random.default_rng(2)
    return xr.Dataset(
        {
            "tas": (("time", "x"), rng.random((30, 4)), {"units": "K"}),
            "label": ("x", np.array(["a", "b", "c", "d"])),
            "day": ("time", pd.date_range("2000-01-01", periods=30)),
            "area": ("x", np.arange(4.0) + 1),
        },
        attrs={"title": "mixed"},
    )


@pytest.mark.parametrize("op", ["sum", "mean", "std", "var", "min", "max", "median", "quantile"])
def test_dataset_reductions_keep_and_drop_as_xarray(mixed, op, threaded):
    kwargs = {"q": 0.5} if op == "quantile" else {}
    plan = mixed.memchunk.plan(op, dim="time", memory_limit="1GB", **kwargs)
    assert any(n.startswith("not planned: label") for n in plan.notes)
    result = mixed.memchunk.apply(op, dim="time", memory_limit="1GB", **kwargs).compute()
    numeric = mixed[["tas", "area"]]
    expected = (
        numeric.quantile(0.5, dim="time") if op == "quantile" else getattr(numeric, op)("time")
    )
    xr.testing.assert_allclose(result[["tas", "area"]], expected)
    assert result.attrs == expected.attrs and result.tas.attrs == expected.tas.attrs
    # strings without the reduced dim are kept where xarray keeps them (not by std/var)
    assert ("label" in result) == (op not in ("std", "var"))
    # datetimes are reduced by mean, min and max, as xarray does; the others drop them
    assert ("day" in result) == (op in ("mean", "min", "max"))
    if "day" in result:
        assert result.day.values == getattr(mixed.day, op)("time").values


def test_gst3d_dataset_plans_the_volume_and_says_what_it_left_out(threaded):
    ds = synthetic_seismic((30, 30, 30))
    ds["note"] = ("inline", np.array(["x"] * 30))
    plan = ds.memchunk.plan("gst3d", memory_limit="1GB")
    assert any(n.startswith("not planned: note") for n in plan.notes)
    assert list(ds.memchunk.apply("gst3d", memory_limit="1GB").data_vars) == ["dip"]


@pytest.mark.parametrize("keep_attrs", [None, True, False])
@pytest.mark.parametrize("option", [None, True, False])
@pytest.mark.parametrize("op", ["mean", "median", "quantile"])
def test_keep_attrs_as_xarray(op, keep_attrs, option, threaded):
    data = field()
    data.attrs["units"] = "K"
    kwargs = {"q": 0.5} if op == "quantile" else {}
    with xr.set_options(keep_attrs="default" if option is None else option):
        ours = data.memchunk.apply(op, dim="time", keep_attrs=keep_attrs, **kwargs)
        theirs = getattr(data, op)(
            *([0.5] if op == "quantile" else []), dim="time", keep_attrs=keep_attrs
        )
    assert ours.attrs == theirs.attrs


def test_plan_attribute_only_when_asked(threaded):
    data = field()
    assert "memchunk_plan" not in data.memchunk.apply("mean", dim="time").attrs
    recorded = data.memchunk.apply("mean", dim="time", record_plan=True).attrs["memchunk_plan"]
    assert recorded.startswith("mean: chunks")


def test_unnamed_results_are_named_and_unnamed_arrays_refused_by_writes(tmp_path, threaded):
    data = field().rename(None)
    result = data.memchunk.apply("mean", dim="time")
    assert result.name == "mean"
    assert result.memchunk.to_zarr(tmp_path / "mean.zarr").exists()
    with pytest.raises(xm.MemchunkError, match="has no name"):
        data.memchunk.to_zarr(tmp_path / "unnamed.zarr")
    assert not (tmp_path / "unnamed.zarr").exists()


@pytest.mark.cluster
def test_a_cluster_without_workers_is_refused_not_waited_on(quiet_distributed):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=0, dashboard_address=":0", processes=False) as cluster,
        Client(cluster),
        pytest.raises(xm.MemchunkError, match="has no workers"),
    ):
        field().memchunk.plan("mean", dim="time")


# --- the command line: exit 2, one line, no traceback, before any cluster ---------------------


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    synthetic_seismic((24, 20, 18)).to_zarr(root / "volume.zarr")
    synthetic_climate(40, 6, 8).to_netcdf(root / "tas.nc")
    (root / "afile").write_text("not a directory\n")
    return root


CLI_REFUSED = [
    (["plan", "gst3d", "{root}/volume.zarr", "-o", "sigma=abc"], "sigma must be a number"),
    (["plan", "gst3d", "{root}/volume.zarr", "-o", "dtype=foo"], "float dtype"),
    (["plan", "quantile", "{root}/tas.nc", "--dim", "time", "-o", "q=abc"], "number or a list"),
    (
        ["plan", "svd", "{root}/tas.nc", "-o", "sample_dims=time", "-o", "n_power_iter=x"],
        "n_power_iter must be an int",
    ),
    (["plan", "gst3d", "{root}/volume.zarr", "--memory-limit", "1e400"], "cannot parse"),
    (
        [
            "run",
            "quantile",
            "{root}/tas.nc",
            "{root}/out.zarr",
            "--dim",
            "time",
            "-o",
            "q=0.5",
            "-o",
            "method=bogus",
        ],
        "method must be one of",
    ),
    (
        ["run", "gst3d", "{root}/volume.zarr", "{root}/out.zarr", "--nworkers", "0"],
        "--nworkers must be at least 1",
    ),
    (
        ["run", "gst3d", "{root}/volume.zarr", "{root}/out.zarr", "--nworkers", "-2"],
        "--nworkers must be at least 1",
    ),
    (
        ["run", "gst3d", "{root}/volume.zarr", "{root}/out.zarr", "--nthreads", "0"],
        "--nthreads must be at least 1",
    ),
    (["run", "gst3d", "{root}/volume.zarr", "{root}/afile/out.zarr"], "is not a directory"),
    (
        ["run", "gst3d", "{root}/volume.zarr", "{root}/out.zarr", "--memory-limit", "150MB"],
        "no room for a task",
    ),
    (["calibrate", "gst3d", "--dtype", "foo"], "--dtype must be a float dtype"),
    (["calibrate", "gst3d", "--repeats", "0"], "--repeats must be at least 1"),
    (["demo", "--size", "-5"], "--size must be at least"),
]


@pytest.mark.parametrize(
    ("args", "message"), CLI_REFUSED, ids=[" ".join(c[0][:4]) for c in CLI_REFUSED]
)
def test_cli_refuses_with_one_line_before_a_cluster_starts(cli_files, args, message):
    start = time.perf_counter()
    result = subprocess.run(
        [*MEMCHUNK, *[a.format(root=cli_files) for a in args]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (cli_files / "out.zarr").exists()
    assert time.perf_counter() - start < 30  # no cluster was started and waited on


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cli_interrupted_run_says_one_line_and_leaves_nothing(tmp_path, sig):
    source = tmp_path / "big.zarr"
    synthetic_seismic((160, 160, 160), chunks=80).to_zarr(source)
    target = tmp_path / "dip.zarr"
    proc = subprocess.Popen(
        [
            *MEMCHUNK,
            "run",
            "gst3d",
            str(source),
            str(target),
            "--nworkers",
            "1",
            "--memory-limit",
            "2GB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        "memchunk-partial" in p.name for p in tmp_path.iterdir()
    ):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err  # 143 for SIGTERM, 130 for SIGINT, as shells say
    assert "interrupted" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.zarr"]


def run_mean(files, target):
    """``memchunk run mean`` on the small netCDF file, on a LocalCluster of one worker."""
    return subprocess.run(
        [
            *MEMCHUNK,
            "run",
            "mean",
            str(files / "tas.nc"),
            str(target),
            "--dim",
            "time",
            "--nworkers",
            "1",
            "--memory-limit",
            "1GB",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_progress_is_plain_lines_when_not_a_terminal(cli_files, tmp_path):
    result = run_mean(cli_files, tmp_path / "m.zarr")
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stdout
    assert "100% of" in result.stdout and "tasks done" in result.stdout


# --- writes that lose nothing ----------------------------------------------------------------

KILL_AT_SWAP = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, xarray as xr
    from xarray_memchunk import io

    real = os.replace

    def replace(src, dst):
        if "memchunk-complete" in str(src):  # the new result is complete, the old one aside
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    io.os.replace = replace
    new = xr.Dataset({"v": ("x", np.arange(3.0) + 10)})
    io.safe_write(new, sys.argv[1], overwrite=True)
    """
)


def test_a_kill_between_the_renames_is_finished_by_the_next_write(tmp_path):
    target = tmp_path / "out.zarr"
    xr.Dataset({"v": ("x", np.arange(3.0))}).to_zarr(target)
    proc = subprocess.run([sys.executable, "-c", KILL_AT_SWAP, str(target)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()  # killed with the old target aside and the new one complete
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n.split("-")[1] for n in names] == ["complete", "old"]
    assert len({n.rsplit("-", 1)[1] for n in names}) == 1  # both pieces of the same write
    done = recover(target)
    assert any(m.startswith("moved") and m.endswith("was replacing out.zarr") for m in done)
    np.testing.assert_array_equal(xr.open_zarr(target).v.values, np.arange(3.0) + 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]


def test_the_next_write_finishes_the_interrupted_one_then_refuses_to_overwrite(tmp_path):
    target = tmp_path / "out.zarr"
    xr.Dataset({"v": ("x", np.arange(3.0))}).to_zarr(target)
    subprocess.run([sys.executable, "-c", KILL_AT_SWAP, str(target)], timeout=120)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(xm.MemchunkError, match="exists"):
            safe_write(xr.Dataset({"v": ("x", np.zeros(2))}), target, overwrite=False)
    assert any("moved" in str(w.message) for w in caught)
    assert "removed" in " ".join(str(w.message) for w in caught)  # the old copy, replaced
    np.testing.assert_array_equal(xr.open_zarr(target).v.values, np.arange(3.0) + 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]


def test_a_partial_write_left_by_a_hard_kill_is_reported_and_removed(tmp_path):
    target = tmp_path / "out.zarr"
    (tmp_path / ".out.zarr.memchunk-partial-1234abcd").mkdir()
    with pytest.warns(RecoveredWriteWarning, match="interrupted before it ended"):
        safe_write(xr.Dataset({"v": ("x", np.arange(2.0))}), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]


def test_an_old_target_left_after_its_replacement_is_removed(tmp_path):
    target = tmp_path / "out.zarr"
    xr.Dataset({"v": ("x", np.arange(2.0))}).to_zarr(target)
    xr.Dataset({"v": ("x", np.zeros(2))}).to_zarr(tmp_path / ".out.zarr.memchunk-old-1234abcd")
    with pytest.warns(RecoveredWriteWarning, match="already replaced"):
        safe_write(xr.Dataset({"v": ("x", np.ones(2))}), target, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]
    np.testing.assert_array_equal(xr.open_zarr(target).v.values, np.ones(2))


def test_the_command_line_reports_what_it_recovered(cli_files, tmp_path):
    (tmp_path / ".m.zarr.memchunk-partial-0000beef").mkdir()
    result = run_mean(cli_files, tmp_path / "m.zarr")
    assert result.returncode == 0, result.stderr
    assert "memchunk: removed .m.zarr.memchunk-partial-0000beef" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.zarr"]


def test_an_empty_dim_is_refused_before_any_block_is_computed():
    """A new user's trial: a median over an empty dim computed 2 blocks of the input (to
    measure producing them) before it was refused."""
    import dask.array as da

    computed = []

    def counted(block):
        computed.append(block.shape)
        return block + 1

    data = da.zeros((0, 40, 60), chunks=(10, 40, 60), dtype="float32").map_blocks(counted)
    empty = xr.DataArray(data, dims=("time", "lat", "lon"), name="tas")
    computed.clear()  # map_blocks called it on tiny arrays to infer its result's type
    with pytest.raises(xm.DimensionError, match="'time' has length 0"):
        empty.memchunk.plan("median", dim="time")
    assert computed == []
    # an empty variable the operator does not plan is passed through, as before
    full = xr.DataArray(da.ones((20, 4, 5), chunks=(10, 4, 5)), dims=("time", "lat", "lon"))
    stations = xr.DataArray(np.zeros(0), dims="station")
    plan = xr.Dataset({"tas": full, "stations": stations}).memchunk.plan("median", dim="time")
    assert any(n.startswith("not planned: stations") for n in plan.notes)


def test_a_variable_named_by_an_int_is_refused_before_it_is_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    double = xm.BlockwiseOperator("double-int-named", lambda block: block * 2)
    ds = xr.Dataset({1: (("y", "x"), np.zeros((40, 30), "float32"))}).chunk({"y": 10})
    with pytest.raises(xm.MemchunkError, match="not named by a string"):
        ds.memchunk.plan(double)
    assert not list(tmp_path.rglob("*.json"))  # nothing measured for a refusal


def _fails_while_others_write(block, block_info=None):
    """The first chunk's task fails soon; the others still write theirs 0.6 s later."""
    import time

    if block_info[0]["chunk-location"][0] == 0:
        time.sleep(0.05)  # once the others run
        raise RuntimeError("the first chunk fails")
    time.sleep(0.6)
    return block * 2


def _failing_write(tmp_path):
    """A write whose first task fails while the others are still running; what it left."""
    data = dask.array.ones((4, 10), chunks=(1, 10)).map_blocks(
        _fails_while_others_write, dtype=float
    )
    target = tmp_path / "out.zarr"
    xr.Dataset({"v": ("x", np.arange(3.0))}).to_zarr(target)
    with pytest.raises(RuntimeError, match="the first chunk fails"):
        safe_write(xr.Dataset({"v": (("x", "y"), data)}), target, overwrite=True)
    time.sleep(1.0)  # past the end of every task
    np.testing.assert_array_equal(xr.open_zarr(target).v.values, np.arange(3.0))
    return sorted(p.name for p in tmp_path.iterdir())


def test_a_failed_write_removes_its_partial_store_after_the_tasks_still_writing(tmp_path, threaded):
    # before: the partial store was removed as the error arrived, and the task still
    # running on the other thread wrote its chunk into it again after
    with dask.config.set(num_workers=2):
        assert _failing_write(tmp_path) == ["out.zarr"]


def test_a_failed_write_on_a_cluster_waits_for_the_tasks_still_writing(tmp_path, cluster_client):
    make, client_type = cluster_client
    with make("2GB") as cluster, client_type(cluster):
        assert _failing_write(tmp_path) == ["out.zarr"]

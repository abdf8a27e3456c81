"""A user's block function that reads further than its declared halo is refused at plan time."""

import ast
import re

import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk.operators.halo_reach import check_reach

SIZES = {"x": 64, "y": 48, "z": 40}


def refused(func, cut, dtype="float32", **kwargs):
    """The message ``check_reach`` raises, or None where it accepts."""
    try:
        check_reach(func, SIZES, np.dtype(dtype), cut, kwargs, "fn")
    except xm.MemchunkError as exc:
        return str(exc)
    return None


def test_a_stencil_with_its_halo_passes_and_one_with_less_is_told_the_halo_that_agrees():
    box = lambda b: ndimage.uniform_filter(b, 5)  # noqa: E731
    assert refused(box, {"x": 2, "y": 2, "z": 2}) is None
    message = refused(box, {"x": 1, "y": 2, "z": 2})
    assert "reads further along 'x' than a halo of 1" in message
    assert "declare depth={'x': 2, 'y': 2, 'z': 2}" in message


def test_a_gaussian_reaches_four_sigmas_as_scipy_truncates_it():
    gauss = lambda b: ndimage.gaussian_filter(b, 2.0)  # noqa: E731
    assert "declare depth={'x': 8, 'y': 8, 'z': 8}" in refused(gauss, {"x": 6, "y": 8, "z": 8})
    assert refused(gauss, {"x": 8, "y": 8, "z": 8}) is None
    assert refused(gauss, {"x": (8, 8), "y": 8, "z": 8}) is None  # (before, after)


def test_the_suggested_halo_agrees_to_rounding_along_every_dim_not_only_those_refused():
    """A new user's smoothed squared derivative (reach 12 along each dim), declared 8: along
    'crossline' 8 passed the check's tolerance (1.2e-4 short), and the refusal suggested
    {'inline': 11, 'crossline': 8, 'sample': 10}, which left 2.08e-5 of the largest value on
    the user's data where the docs promise 1e-6."""

    def func(b):
        inner = ndimage.gaussian_filter(b.astype(np.float64), 1.0, order=(1, 0, 0))
        return ndimage.gaussian_filter(inner**2, 2.0)

    message = refused(func, {"x": 8, "y": 8, "z": 8})
    depth = ast.literal_eval(re.search(r"declare depth=(\{[^}]*\})", message)[1])
    assert depth == {"x": 12, "y": 12, "z": 12}  # a float64 result: to 1e-9, its whole reach
    assert "along 'x' than a halo of 8" in message
    assert refused(func, depth) is None
    whole = func(np.random.default_rng(7).standard_normal((64, 48, 40)))
    for axis, dim in enumerate(("x", "y", "z")):  # cut at the middle with the suggested halo
        x = np.random.default_rng(7).standard_normal((64, 48, 40))
        m, h = x.shape[axis] // 2, depth[dim]
        left = func(np.take(x, range(m + h), axis=axis)).take(range(m), axis=axis)
        right = func(np.take(x, range(m - h, x.shape[axis]), axis=axis))
        joined = np.concatenate([left, right.take(range(h, right.shape[axis]), axis=axis)], axis)
        assert np.abs(joined - whole).max() <= 1e-6 * np.abs(whole).max()


def test_a_dim_the_function_fails_on_is_left_out_of_the_suggestion_not_a_crash():
    """A review: every cut dim was searched, also one whose short trials the function failed
    on, and the search raised a bare ValueError (max() of no trials)."""

    def func(b):
        if b.shape[0] < 9:  # the halves along x (10 long) run; trials along y or z (8) fail
            raise ValueError("too short")
        return ndimage.uniform_filter(b, 5)

    message = refused(func, {"x": 1, "y": 1, "z": 1})  # y and z: trials 8 long along x
    assert "declare depth={'x': 2, 'y': 1, 'z': 1}" in message


def test_a_free_dim_the_function_filters_along_is_refused():
    box = lambda b: ndimage.uniform_filter(b, 5)  # noqa: E731
    message = refused(box, {"x": 2, "y": 2, "z": 0})
    assert "along 'z' than no halo" in message
    assert "declare depth={'x': 2, 'y': 2, 'z': 2}" in message


@pytest.mark.parametrize(
    ("func", "whole"),
    [
        (lambda b: b / b.max(), ["x", "y", "z"]),
        (lambda b: np.cumsum(b, axis=0), ["x"]),
        (lambda b: b - b.mean(axis=0), ["x"]),
    ],
    ids=["divided by its maximum", "cumulative sum", "anomaly"],
)
def test_a_function_of_the_whole_dim_is_told_to_keep_it_whole(func, whole):
    message = refused(func, {"x": 0, "y": 0, "z": 0})
    assert f"declare whole={whole}" in message


def test_every_dim_read_further_is_named_at_once_whole_ones_left_out_of_the_depth():
    def func(b):
        return np.cumsum(ndimage.uniform_filter(b, 5), axis=0)

    message = refused(func, {"x": 2, "y": 2, "z": 0})
    assert "along 'x' than a halo of 2; along 'z' than no halo" in message
    assert "declare depth={'y': 2, 'z': 2}" in message and "declare whole=['x']" in message


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "bool"])
def test_point_by_point_functions_pass_in_any_dtype(dtype):
    assert refused(lambda b: b * 2 if b.dtype != bool else ~b, {"x": 0, "y": 0}, dtype) is None


def test_a_reduction_over_a_dropped_dim_is_checked_along_the_dims_it_keeps():
    mean = lambda b: b.mean(axis=2)  # noqa: E731
    sizes = {"x": 64, "y": 48, "z": 40}
    check_reach(mean, sizes, np.dtype("f4"), {"x": 0, "y": 0}, {}, "fn", kept=["x", "y"])
    smooth_mean = lambda b: ndimage.uniform_filter(b, 3).mean(axis=2)  # noqa: E731
    with pytest.raises(xm.MemchunkError, match="declare depth=\\{'x': 1\\}"):
        check_reach(smooth_mean, sizes, np.dtype("f4"), {"x": 0}, {}, "fn", kept=["x", "y"])


def test_a_function_that_fails_on_small_arrays_is_checked_when_it_runs_instead():
    def needs_long(b):
        if b.shape[0] < 100:
            raise ValueError("too short")
        return b

    assert refused(needs_long, {"x": 0}) is None


def test_a_plan_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    volume = xr.DataArray(np.zeros((64, 64, 64), "f4"), dims=("inline", "crossline", "sample"))

    @xm.operator(depth={"inline": 2, "crossline": 2, "sample": 2}, register=False)
    def smoothed(block):
        return ndimage.gaussian_filter(block, 1.5)

    every = "declare depth={'inline': 6, 'crossline': 6, 'sample': 6}"
    with pytest.raises(xm.MemchunkError, match=re.escape(every)):
        volume.chunk(32).memchunk.plan(smoothed)
    assert not list(tmp_path.rglob("*.json"))  # refused before it was measured


def daily(days=730, lat=30, lon=40):
    time = xr.date_range("2000-01-01", periods=days, freq="D", use_cftime=False)
    values = np.random.default_rng(0).random((days, lat, lon), dtype="float32")
    coords = {"time": time, "lat": np.linspace(-80, 80, lat)}
    return xr.DataArray(values, dims=("time", "lat", "lon"), coords=coords, name="tas")


@pytest.mark.parametrize(
    "func",
    [
        lambda tas: tas.rolling(lat=3, center=True).mean(),
        lambda tas: tas.differentiate("lon"),
        lambda tas: tas - tas.mean("lon"),
    ],
    ids=["rolling along lat", "derivative along lon", "zonal anomaly"],
)
def test_an_xarray_function_that_reads_neighbours_along_a_free_dim_is_refused(func):
    op = xm.operator(name="neighbours", whole=["time"], xarray=True, register=False)(func)
    with pytest.raises(xm.MemchunkError, match=r"may be cut along .* declare them whole"):
        daily().chunk({"time": 73}).memchunk.plan(op, measure="never")


@pytest.mark.parametrize(
    "func",
    [
        lambda tas: tas.groupby("time.month") - tas.groupby("time.month").mean(),
        lambda tas: tas * np.cos(np.deg2rad(tas.lat)),
    ],
    ids=["monthly anomaly", "area weights"],
)
def test_an_xarray_function_point_by_point_along_its_free_dims_passes(func):
    op = xm.operator(name="pointwise", whole=["time"], xarray=True, register=False)(func)
    with pytest.raises(xm.MemchunkError, match="has no memory model"):  # past the check
        daily().chunk({"time": 73}).memchunk.plan(op, measure="never")


def forward_fill(b):
    """NaN filled from the last value before them along axis 0 (pandas' ffill)."""
    index = np.where(np.isnan(b), 0, np.arange(b.shape[0]).reshape(-1, *[1] * (b.ndim - 1)))
    return np.take_along_axis(b, np.maximum.accumulate(index, axis=0), axis=0)


def test_functions_that_fill_gaps_from_across_the_cut_are_refused():
    """Found by a review: random values hold no NaN, so a fill from neighbours passed."""
    assert "declare whole=['x']" in refused(forward_fill, {"x": 2, "y": 0, "z": 0})


def test_infinities_in_the_result_are_compared_where_they_are():
    """Found by a review: an infinity made the tolerance infinite, and everything agreed."""

    def over(b):
        return ndimage.uniform_filter(b.astype("f8"), 9) / b  # inf where b is 0

    assert "declare depth={'x': 4" in refused(over, {"x": 1, "y": 4, "z": 4}, "int16")


@pytest.mark.parametrize(
    ("size", "origin", "declared", "agreeing"),
    [(7, 3, (4, 0), "(6, 0)"), (5, 2, (0, 4), "(4, 0)"), (5, -2, (4, 0), "(0, 4)")],
    ids=["trailing, short", "trailing, wrong side", "leading, wrong side"],
)
def test_one_sided_halos_are_told_per_side(size, origin, declared, agreeing):
    """A window of ``size`` shifted by ``origin`` reads only before (after) each element."""

    def window(b):
        return ndimage.uniform_filter1d(b, size, axis=0, origin=origin)

    message = refused(window, {"x": declared})
    assert f"declare depth={{'x': {agreeing}}}" in message


def test_random_noise_is_not_checked():
    def noisy(b):
        return b + np.random.default_rng().standard_normal(b.shape).astype(b.dtype)

    assert refused(noisy, {"x": 0, "y": 0, "z": 0}) is None


def test_a_function_that_fails_on_longer_arrays_is_refused_with_what_the_short_ones_said():
    def short_only(b):
        if b.shape[0] > 40:
            raise ValueError("too long")
        return ndimage.uniform_filter(b, 5)

    assert "declare depth={'x': 2" in refused(short_only, {"x": 1, "y": 2, "z": 2})


def test_the_check_can_be_turned_off(tmp_path, monkeypatch):
    import dask

    box = lambda b: ndimage.uniform_filter(b, 5)  # noqa: E731
    with dask.config.set({"memchunk.check-reach": False}):
        op = xm.BlockwiseOperator("box-unchecked", box, depth={"x": 1, "y": 1})
        field = xr.DataArray(np.zeros((64, 48), "f4"), dims=("x", "y")).chunk(16)
        with pytest.raises(xm.MemchunkError, match="has no memory model"):  # past the check
            field.memchunk.plan(op, measure="never")


@pytest.mark.parametrize(
    "func",
    [
        lambda tas: tas.rolling(lon=21, center=True).mean(),
        lambda tas: tas.where(tas > -1).interpolate_na("lat"),
        lambda tas: tas.fillna(tas.mean("lon")),
    ],
    ids=["window wider than 16", "interpolating gaps", "filling with a zonal mean"],
)
def test_an_xarray_function_that_reaches_far_or_fills_gaps_along_a_free_dim_is_refused(func):
    op = xm.operator(name="far", whole=["time"], xarray=True, register=False)(func)
    with pytest.raises(xm.MemchunkError, match="may be cut along"):
        daily(lat=40, lon=48).chunk({"time": 73}).memchunk.plan(op, measure="never")


def test_an_xarray_function_with_noise_is_not_checked():
    def noisy(tas):
        return tas + np.random.default_rng().standard_normal(tas.shape).astype("f4")

    op = xm.operator(name="noisy", whole=["time"], xarray=True, register=False)(noisy)
    with pytest.raises(xm.MemchunkError, match="has no memory model"):  # past the check
        daily().chunk({"time": 73}).memchunk.plan(op, measure="never")

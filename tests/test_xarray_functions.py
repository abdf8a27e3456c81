"""A function of an xarray object as an operator: climatologies, resampling, rolling, chains."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.errors import DimensionError, MemchunkError
from xarray_memchunk.operators.xarray_function import XarrayFunctionOperator

MODEL = xm.LinearMemoryModel({"input_bytes": 6.0})


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    return tmp_path


def daily(years=3, lat=12, lon=16, chunks=None, dtype="float32"):
    """Daily data of ``years`` years, in one-day chunks unless told otherwise."""
    time = pd.date_range("2001-01-01", periods=365 * years, freq="D")
    values = np.random.default_rng(0).standard_normal((time.size, lat, lon)).astype(dtype)
    array = xr.DataArray(
        values,
        dims=("time", "lat", "lon"),
        coords={"time": time, "lat": np.linspace(-80, 80, lat), "lon": np.arange(lon) * 10.0},
        name="tas",
    )
    return array.chunk(chunks or {"time": 1})


def anomaly_p90(tas: xr.DataArray) -> xr.DataArray:
    anomaly = tas.groupby("time.month") - tas.groupby("time.month").mean()
    return anomaly.groupby("time.month").quantile(0.9)


def monthly(tas: xr.DataArray) -> xr.DataArray:
    return tas.resample(time="1MS").mean()


def smooth(tas: xr.DataArray) -> xr.DataArray:
    return tas.rolling(time=30, center=True).mean()


def trend(tas: xr.DataArray) -> xr.Dataset:
    return tas.polyfit("time", 1)


def area_mean(tas: xr.DataArray) -> xr.DataArray:
    return tas.weighted(np.cos(np.deg2rad(tas.lat))).mean(("lat", "lon"))


@pytest.mark.parametrize(
    ("func", "dims"),
    [
        (anomaly_p90, {"whole": ["time"]}),
        (monthly, {"whole": ["time"]}),
        (smooth, {"whole": ["time"]}),
        (area_mean, {"free": ["time"]}),
    ],
)
def test_results_equal_the_expression_run_by_xarray(func, dims, threaded):
    op = xm.operator(memory_model=MODEL, register=False, **dims)(func)
    data = daily()
    plan = data.memchunk.plan(op, memory_limit="1GB")
    whole = ["time"] if "whole" in dims else ["lat", "lon"]
    assert all(plan.chunks[d] == data.sizes[d] for d in whole)
    result = plan.apply()
    assert result.chunks is not None  # lazy
    expected = func(data.load())
    xr.testing.assert_allclose(result.compute(), expected)


def test_a_dataset_result_is_named_after_the_variable(threaded):
    op = xm.operator(whole=["time"], memory_model=MODEL, register=False)(trend)
    ds = daily(years=2).to_dataset()
    result = ds.memchunk.apply(op, memory_limit="1GB").compute()
    expected = trend(ds.tas.load())
    xr.testing.assert_allclose(result["tas_polyfit_coefficients"], expected["polyfit_coefficients"])


def climatology(tas: xr.DataArray) -> xr.DataArray:
    return tas.groupby("time.month").mean()


def with_static_fields(data: xr.DataArray) -> xr.Dataset:
    """``data``'s Dataset with a land mask and an orography (lat, lon) and a series (time)."""
    ds = data.to_dataset()
    shape = (data.lat.size, data.lon.size)
    ds["mask"] = xr.DataArray(
        np.arange(np.prod(shape)).reshape(shape) % 3 == 0, dims=("lat", "lon")
    )
    ds["orography"] = xr.DataArray(
        np.linspace(0, 1, np.prod(shape)).reshape(shape), dims=("lat", "lon")
    )
    ds["station"] = data.isel(lat=0, lon=0, drop=True).rename("station")
    return ds


@pytest.mark.parametrize(
    ("func", "dims", "left"),
    [
        (climatology, {"whole": ["time"]}, "'mask', 'orography'"),
        (area_mean, {"free": ["time"]}, "'mask', 'orography', 'station'"),  # station: no lat
    ],
)
def test_variables_the_plan_leaves_out_are_named_in_a_warning(func, dims, left, threaded):
    """They were left out with a plan note only. xarray would compute them outside the plan:
    an anomaly broadcasts a static field along time, and a run's report would count those
    tasks as the operator's."""
    op = xm.operator(memory_model=MODEL, register=False, **dims)(func)
    ds = with_static_fields(daily(years=1, lat=6, lon=8, chunks={"time": 73}))
    plan = ds.memchunk.plan(op, memory_limit="1GB")
    assert "not planned: mask" in " ".join(plan.notes)
    message = rf"leaves {left} out of the result: .*plan.notes say which"
    with pytest.warns(UserWarning, match=message):
        result = plan.apply()
    assert list(result.data_vars) == [v for v in ds.data_vars if f"'{v}'" not in left]
    xr.testing.assert_allclose(result.tas.compute(), func(ds.tas.load()))


def test_the_decorator_tells_xarray_functions_from_numpy_ones():
    assert isinstance(xm.operator(whole=["time"], register=False)(monthly), XarrayFunctionOperator)

    def plain(tas):  # no annotation: declared by free=, or xarray=True
        return tas.mean("time")

    assert isinstance(xm.operator(free=["lat"], register=False)(plain), XarrayFunctionOperator)
    declared = xm.operator(whole=["time"], xarray=True, register=False)(plain)
    assert isinstance(declared, XarrayFunctionOperator)
    assert isinstance(xm.operator(register=False)(plain), xm.BlockwiseOperator)
    assert declared(daily(years=1)).dims == ("lat", "lon")  # still callable as a function


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "which dims the function needs whole"),
        ({"whole": ["time"], "free": ["lat"]}, "not both"),
        ({"whole": ["time"], "depth": {"time": 2}}, "depth apply to NumPy block functions"),
    ],
)
def test_unclear_dims_are_refused_when_decorated(kwargs, message):
    with pytest.raises(MemchunkError, match=message):
        xm.operator(register=False, **kwargs)(monthly)


def test_a_function_that_fails_on_the_data_fails_before_anything_runs(produced):
    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def broken(tas: xr.DataArray) -> xr.DataArray:
        return tas.groupby("time.nonsense").mean()

    data = daily(years=1)
    counted = data.copy(data=data.data.map_blocks(produced))
    produced.shapes.clear()
    with pytest.raises(MemchunkError, match="its function raised AttributeError"):
        counted.memchunk.plan(broken, memory_limit="1GB")
    assert produced.shapes == []
    with pytest.raises(DimensionError, match="needs dims"):
        daily(years=1).rename(time="t").memchunk.plan(
            xm.operator(whole=["time"], memory_model=MODEL, register=False)(monthly)
        )


def test_it_measures_itself_with_the_data_dates(user_dir, monkeypatch):
    """Self-calibration runs the function on blocks that carry the data's own dates."""
    import dask

    op = xm.operator(whole=["time"], register=False)(anomaly_p90)
    data = daily(years=2, lat=20, lon=40)
    with dask.config.set({"memchunk.self-calibration-seconds": 3}):
        plan = data.memchunk.plan(op, memory_limit="1GB")
    assert any("calibrated now" in note for note in plan.notes)
    assert list(user_dir.glob("anomaly_p90-*-cpu.json"))
    # a task of the plan holds at least its input block and the anomalies made from it
    block = 4 * np.prod(list(plan.chunks.values()))
    assert plan.predicted_task_bytes >= 2 * block


def test_a_reduction_over_a_dim_the_plan_may_cut_is_refused():
    @xm.operator(free=["lat", "lon"], memory_model=MODEL, register=False)
    def zonal(tas: xr.DataArray) -> xr.DataArray:
        return tas.mean("lon")  # lon is free: a block's mean is not the mean

    lacks = r"lacks \['lon'\] \(reduced over, or renamed\).*declare them whole"
    with pytest.raises(MemchunkError, match=lacks):
        daily(years=1).memchunk.plan(zonal, memory_limit="1GB")


def test_whole_dims_may_be_named_by_their_cf_axis(user_dir, threaded):
    """A new user's whole=["T"] was refused ('needs dims ['T']'), where dim="T" works."""
    data = daily(years=1, chunks={"time": 365})
    data.time.attrs["axis"] = "T"

    @xm.operator(whole=["T"], register=False)
    def anomaly(tas: xr.DataArray) -> xr.DataArray:
        return tas - tas.mean("time")

    plan = data.memchunk.plan(anomaly, memory_limit="1GB", chunks={"lat": 6})
    assert plan.chunks["time"] == data.sizes["time"] and plan.chunks["lat"] == 6
    xr.testing.assert_allclose(plan.apply().compute(), anomaly(data.load()), atol=1e-6)


def test_a_function_written_for_a_dataset_is_told_it_gets_one_variable():
    """A new user's ``ds.tas.where(ds.sftlf < 50)`` failed per variable, with no word why."""

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def ocean(ds: xr.Dataset) -> xr.DataArray:
        return ds.tas.where(ds.sftlf < 50).mean("time")

    data = daily(years=1).to_dataset()
    data["sftlf"] = data.tas.isel(time=0, drop=True) * 0
    with pytest.raises(MemchunkError, match=r"called once per variable.*set_coords"):
        data.memchunk.plan(ocean, memory_limit="1GB")


def _selected(tas: xr.DataArray) -> xr.DataArray:
    return tas.sel(lat=slice(-30, 30)).mean("time")


def _coarsened(tas: xr.DataArray) -> xr.DataArray:
    return tas.coarsen(lon=2, boundary="trim").mean()


def _to_180(tas: xr.DataArray) -> xr.DataArray:
    return tas.assign_coords(lon=((tas.lon + 180) % 360) - 180).sortby("lon").mean("time")


def _rolled(tas: xr.DataArray) -> xr.DataArray:
    return tas.roll(lon=3, roll_coords=True).mean("time")


@pytest.mark.parametrize(
    ("func", "what"),
    [
        (_selected, "the length of 'lat'"),
        (_coarsened, "the length of 'lon'"),
        (_to_180, "the labels of 'lon'"),
        (_rolled, "the labels of 'lon'"),
    ],
)
def test_a_function_that_changes_a_dim_the_plan_may_cut_is_refused(func, what):
    """A new user's selection and coarsening gave results of the input's shape that failed
    as they were written, and the CMIP idiom of longitudes from -180, sorted in each chunk,
    gave the input's longitudes and values under the wrong ones, silently."""
    op = xm.operator(whole=["time"], memory_model=MODEL, register=False)(func)
    with pytest.raises(MemchunkError, match=f"changes {what}.*Declare '(lat|lon)' whole"):
        daily(years=1, lon=36).memchunk.plan(op, memory_limit="1GB", chunks={"lat": 6, "lon": 9})


def _with_cell_area(tas: xr.DataArray) -> xr.Dataset:
    weight = np.cos(np.deg2rad(tas.lat))
    mean = tas.mean("time").assign_coords(cell_area=weight * xr.ones_like(tas.lon))
    return xr.Dataset({"mean": mean, "std": tas.std("time")}).assign_coords(weight=weight)


def test_coordinates_the_function_makes_along_dims_the_plan_cuts_are_kept(threaded):
    """They were dropped: a new user's ``cell_area`` was missing from the result."""
    op = xm.operator(whole=["time"], memory_model=MODEL, register=False)(_with_cell_area)
    data = daily(years=1)
    result = data.memchunk.apply(op, memory_limit="1GB", chunks={"lat": 6, "lon": 8})
    expected = _with_cell_area(data.load())
    assert set(result.coords) == set(expected.coords) == {"lat", "lon", "cell_area", "weight"}
    xr.testing.assert_allclose(result.compute(), expected)


CALLS: list[int] = []


def _counted_cell_area(tas: xr.DataArray) -> xr.DataArray:
    CALLS.append(tas.size)
    weight = np.cos(np.deg2rad(tas.lat)) * xr.ones_like(tas.lon)
    return tas.mean("time").assign_coords(cell_area=weight)


def test_a_datasets_coordinate_made_by_the_function_leaves_apply_lazy(threaded):
    """A review found apply() computing every block: each variable brought its own lazy
    ``cell_area``, and xarray computed them to compare them."""
    op = xm.operator(whole=["time"], memory_model=MODEL, register=False)(_counted_cell_area)
    ds = daily(years=1).to_dataset()
    ds["pr"] = ds.tas * 2
    plan = ds.memchunk.plan(op, memory_limit="1GB", chunks={"lat": 6, "lon": 8})
    CALLS.clear()
    result = plan.apply()
    assert all(n <= 365 * 2 * 2 for n in CALLS)  # the templates' samples only: no block
    expected = xr.Dataset({v: _counted_cell_area(ds[v].load()) for v in ("tas", "pr")})
    xr.testing.assert_allclose(result.compute(), expected)


def _rescaled(tas: xr.DataArray) -> xr.DataArray:
    return tas.mean("time").assign_coords(area=tas.area * 6.371e6**2)


def _dropped(tas: xr.DataArray) -> xr.DataArray:
    return tas.mean("time").drop_vars("area")


@pytest.mark.parametrize("func", [_rescaled, _dropped])
def test_coordinates_the_function_changes_or_drops_are_its_own(func, threaded):
    """A review found the input's ``area`` back in the result, rescaled or dropped."""
    data = daily(years=1)
    data = data.assign_coords(area=np.cos(np.deg2rad(data.lat)) * xr.ones_like(data.lon))
    op = xm.operator(whole=["time"], memory_model=MODEL, register=False)(func)
    result = data.memchunk.apply(op, memory_limit="1GB", chunks={"lat": 6, "lon": 8})
    xr.testing.assert_allclose(result.compute(), func(data.load()))
    assert set(result.coords) == set(func(data).coords)


def test_labels_dropped_inside_a_block_are_a_clear_error(threaded):
    """Which labels a selection keeps inside a block, the sample of a dim's first and last
    cannot tell: the task that finds its block changed says so."""

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def gap(tas: xr.DataArray) -> xr.DataArray:
        return tas.where((tas.lon < 40) | (tas.lon > 60), drop=True).mean("time")

    result = daily(years=1).memchunk.apply(gap, memory_limit="1GB", chunks={"lon": 8})
    with pytest.raises(MemchunkError, match=r"changed the length of \['lon'\] in a task"):
        result.compute()


def test_labels_given_to_a_dim_without_them_are_refused():
    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def numbered(tas: xr.DataArray) -> xr.DataArray:
        return tas.mean("time").assign_coords(lon=np.arange(tas.sizes["lon"]))

    data = daily(years=1).drop_vars("lon")
    with pytest.raises(MemchunkError, match="gives 'lon' labels of its own"):
        data.memchunk.plan(numbered, memory_limit="1GB", chunks={"lon": 8})


def test_each_task_reads_its_own_block_from_the_file(tmp_path):
    """One task per block calls the function, reading its block itself: no read task waits
    beside it, however many outputs the function has."""
    import dask

    path = tmp_path / "tas.zarr"
    daily(years=1, chunks={"time": 73}).to_dataset().to_zarr(path)
    stored = xr.open_zarr(path)["tas"]

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def two(tas: xr.DataArray) -> xr.Dataset:
        clim = tas.groupby("time.month").mean()
        return xr.Dataset({"clim": clim, "p90": (tas.groupby("time.month") - clim).max("time")})

    for op in (xm.operator(whole=["time"], memory_model=MODEL, register=False)(monthly), two):
        result = stored.memchunk.apply(op, memory_limit="1GB")
        arrays = [result] if isinstance(result, xr.DataArray) else list(result.data_vars.values())
        optimized = dask.optimize(*[a.data.sum() for a in arrays])
        keys = {k for o in optimized for k in dict(o.__dask_graph__())}  # shared once
        names = [str(k[0]) for k in keys if isinstance(k, tuple)]  # a block's task
        # beside them, the function, its arguments and the coordinates, once
        assert {str(k).rsplit("-", 1)[1] for k in keys if not isinstance(k, tuple)} <= {
            "function",
            "arguments",
            "coords",
        }
        assert not any(name.startswith("memchunk-read") for name in names)
        n_blocks = int(np.prod(arrays[0].data.numblocks))
        per_block = [name for name in names if "aggregate" not in name]
        # a task per block calls the function (fused with its output's sum when it has one)
        assert len(per_block) <= (1 + len(arrays)) * n_blocks


def test_coordinates_names_and_variables_reach_the_function_as_xarray_gives_them(
    user_dir, threaded
):
    """2-D and scalar coordinates (Dask-backed too), an unnamed input, two variables sharing
    their data, and a self-calibration that needs a scalar coordinate."""
    import dask

    data = daily(years=1, lat=6, lon=8).drop_vars(["lat", "lon"])
    lat2d = np.linspace(-60, 60, 48).reshape(6, 8)
    data = data.assign_coords(lat2d=(("lat", "lon"), lat2d), height=2.0)
    data = data.assign_coords(lat2d=data.lat2d.chunk())  # a Dask-backed coordinate

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def weighted(tas: xr.DataArray) -> xr.DataArray:
        return (tas * np.cos(np.deg2rad(tas.lat2d))).groupby("time.month").mean() + tas.height

    xr.testing.assert_allclose(data.memchunk.apply(weighted).compute(), weighted(data.load()))
    unnamed = data.rename(None)
    # named as the plan names an unnamed input's result, never after a Dask key
    assert unnamed.memchunk.apply(weighted).name in (None, "weighted")

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def as_dataset(tas: xr.DataArray) -> xr.Dataset:
        return tas.mean("time").to_dataset(name="m")

    shared = xr.Dataset({"a": data.rename("a"), "b": data.rename("b")})
    result = shared.memchunk.apply(as_dataset).compute()
    assert set(result.data_vars) == {"a_m", "b_m"}

    @xm.operator(whole=["time"], register=False)  # measures itself: needs tas.height there
    def with_height(tas: xr.DataArray) -> xr.DataArray:
        return tas.groupby("time.month").mean() + tas.height

    with dask.config.set({"memchunk.self-calibration-seconds": 2}):
        plan = data.memchunk.plan(with_height, memory_limit="1GB")
    xr.testing.assert_allclose(plan.apply().compute(), with_height(data.load()))


def test_the_coordinates_are_in_the_graph_once_not_in_every_task():
    """A calendar's time coordinate (cftime objects, ~60 B a step pickled) goes to the tasks
    as one key: copied into each task, every task the worker received was unpickled into
    small objects that left Python's allocator holding ~0.15 MiB a task after the run, and
    workers at a refusal's stated minimum paused for good."""
    import cloudpickle
    import dask.array

    time = xr.date_range("2001-01-01", periods=365 * 4, freq="D", calendar="noleap")
    values = np.random.default_rng(0).standard_normal((time.size, 4, 8)).astype("float32")
    data = xr.DataArray(
        values, dims=("time", "lat", "lon"), coords={"time": time}, name="tas"
    ).chunk({"time": -1, "lon": 1})
    whole_coordinate = len(cloudpickle.dumps(data.time.values))
    result = data.memchunk.apply(
        xm.operator(whole=["time"], memory_model=MODEL, register=False)(climatology),
        memory_limit="1GB",
        chunks={"lon": 1},
    )
    graph = dict(result.data.__dask_graph__())
    sizes = [len(cloudpickle.dumps(task)) for task in graph.values()]
    assert whole_coordinate > 50_000
    assert sum(size > whole_coordinate / 2 for size in sizes) == 1  # the coordinates' key
    xr.testing.assert_allclose(result.compute(), climatology(data.load()))

    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def scaled(tas: xr.DataArray, weights=None) -> xr.DataArray:
        return (tas * weights.sum()).groupby("time.month").mean()

    weights = np.ones(50_000, dtype="float32")  # 200 kB, an argument of the function
    for given in (weights, dask.array.from_array(weights, chunks=10_000)):  # Dask's: computed
        result = data.memchunk.apply(scaled, memory_limit="1GB", chunks={"lon": 1}, weights=given)
        sizes = [len(cloudpickle.dumps(task)) for task in dict(result.data.dask).values()]
        assert sum(size > weights.nbytes / 2 for size in sizes) <= 2  # coordinates, weights
        xr.testing.assert_allclose(result.compute(), scaled(data.load(), weights=weights))


def test_a_numpy_function_written_for_xarray_is_told_how_to_get_dataarrays():
    @xm.operator(whole=["time"], memory_model=MODEL, register=False)
    def unannotated(tas):
        return tas - tas.mean("time")

    result = daily(years=1, chunks={"time": -1}).memchunk.apply(unannotated, memory_limit="1GB")
    with pytest.raises(TypeError) as raised:
        result.compute(scheduler="sync")
    assert "is given NumPy blocks" in str(raised.value.__notes__)
    assert "annotate it (def f(x: xr.DataArray))" in str(raised.value.__notes__)

    @xm.operator(memory_model=MODEL, register=False)
    def sized(block, table=None):
        return block + table.size  # another argument's error: no word of DataArrays

    result = daily(years=1).memchunk.apply(sized, memory_limit="1GB", table=[1.0])
    with pytest.raises(AttributeError) as unrelated:
        result.compute(scheduler="sync")
    assert not getattr(unrelated.value, "__notes__", None)

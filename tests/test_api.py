import warnings

import dask.array
import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic


@pytest.fixture
def volume():
    return synthetic_seismic((60, 50, 40), chunks=(20, 50, 40))


def test_import_registers_accessor_on_both():
    assert hasattr(xr.Dataset, "memchunk") and hasattr(xr.DataArray, "memchunk")


def test_plan_fields(volume):
    plan = volume.memchunk.plan("gst3d", memory_limit="1.5GB")
    assert plan.operator == "gst3d"
    assert set(plan.chunks) == {"inline", "crossline", "sample"}
    assert {d: sum(c) for d, c in plan.dask_chunks.items()} == dict(volume.sizes)
    assert 0 < plan.predicted_peak_bytes <= plan.budget.per_task
    assert plan.n_chunks == np.prod([len(c) for c in plan.dask_chunks.values()])
    assert plan.binding in {"memory", "parallelism", "task overhead", "storage alignment"}
    text = plan.explain()
    for needle in ("gst3d", "peak", "per-task budget", "halo", "binding"):
        assert needle in text
    assert "<table>" in plan._repr_html_()


def test_explain_names_each_row_for_what_it_is_and_defines_its_terms():
    """Issue 33: two rows were labelled "chunks"; held, gathering, whole dims were undefined."""
    tas = synthetic_climate(365, 30, 60, chunks={"time": 73}).tas
    plan = tas.memchunk.plan("median", dim="time", memory_limit="1GB", measure="never")
    rows = plan._lines()
    labels = [label for label, _ in rows if label != "note"]
    assert len(labels) == len(set(labels)), labels
    assert len(labels) == len(set(labels) - {"note"}) + labels.count("note")  # no label twice
    assert all(len(label.split()) == 1 for label in labels)  # one word each
    assert {"chunks", "tasks", "storage"} <= set(labels)
    text = dict(rows)
    assert text["tasks"].startswith(f"{plan.n_chunks}: one task of the operator per planned chunk")
    assert plan.held_bytes and plan.gather_bytes  # the plan cuts the input's time chunks
    assert "keeps in memory" in text["  held"]
    assert "concatenated from pieces" in text["  gathering"]
    assert text["whole"] == ("time: one chunk along it (the operator needs it whole in every task)")
    assert f"(plan.binding = {plan.binding!r})" in text["binding"]
    assert "the input's storage chunks" in text["storage"]
    # the HTML repr carries the same rows, the terms of the peak indented under it
    html = plan._repr_html_()
    assert html.count("<tr>") == len(rows) and "keeps in memory" in html
    assert "padding-left" in html and "<th style='text-align:left'>chunks</th>" not in html


def test_plan_runs_nothing(volume):
    import dask

    calls = []
    with dask.config.set(scheduler=lambda *a, **k: calls.append(1)):
        volume.memchunk.plan("gst3d")
        volume.memchunk.apply("gst3d")
    assert calls == []


def test_a_report_of_a_plan_applied_with_no_cluster_says_to_start_one(volume, threaded):
    """The README's quickstart: apply, compute, report, with no cluster, was told to apply on
    a distributed cluster "and compute the result first", which it had done."""
    plan = volume.memchunk.plan("gst3d", memory_limit="1.5GB")
    with pytest.raises(xm.MemchunkError, match="no run of this 'gst3d' plan to report"):
        plan.report()
    plan.apply().compute()
    with pytest.raises(xm.MemchunkError, match="applied with no distributed cluster") as err:
        plan.report()
    assert "compute the result first" not in str(err.value)


def test_dataset_in_dataset_out_dataarray_in_dataarray_out(volume, threaded):
    assert isinstance(volume.memchunk.apply("gst3d"), xr.Dataset)
    out = volume.amplitude.memchunk.apply("gst3d")
    assert isinstance(out, xr.DataArray) and out.name == "dip"
    assert out.dims == volume.amplitude.dims


def test_user_chunks_skip_search_and_warn_over_budget(volume):
    plan = volume.memchunk.plan("gst3d", chunks={"inline": 30}, memory_limit="1.5GB")
    assert plan.dask_chunks["inline"] == (30, 30)
    assert plan.binding == "user chunks"
    tiny = xm.Budget(
        worker_memory=10**8, threads_per_worker=1, n_workers=1, per_task=1_000_000, source="test"
    )
    with pytest.warns(xm.MemoryBudgetWarning, match="over the per-task budget"):
        result = volume.memchunk.apply("gst3d", chunks={"inline": 60}, budget=tiny)
    assert result.dip.chunks[0] == (60,)


def test_user_chunks_within_budget_do_not_warn(volume):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        volume.memchunk.apply("gst3d", chunks={"inline": 30}, memory_limit="2GB")


def test_auto_chunks_like_dask(volume):
    plan = volume.memchunk.plan("gst3d", chunks="auto", memory_limit="2GB")
    assert plan.n_chunks == 1  # 60x50x40 float32 is far below dask's 128 MiB


def test_numpy_backed_object_is_planned_as_one_chunk_then_chunked(threaded):
    ds = synthetic_climate(30, 10, 12)  # numpy-backed
    plan = ds.memchunk.plan("mean", dim="time", memory_limit="1GB")
    assert plan.storage_chunks == {"time": None, "lat": None, "lon": None}
    result = ds.memchunk.apply("mean", dim="time", memory_limit="1GB")
    assert result.tas.chunks is not None
    np.testing.assert_allclose(result.tas.values, ds.tas.mean("time").values, rtol=1e-6)


def test_numpy_data_is_chunked_into_views_not_copied(threaded):
    """Dask's from_array copies the array and hashes it; the planned chunks are views of it."""
    ds = synthetic_climate(40, 12, 16)  # numpy-backed
    values = ds.tas.values
    result = ds.memchunk.apply("median", dim="time", chunks={"lon": 4})
    (name,) = [n for n in result.tas.data.dask.layers if n.startswith("memchunk-in-memory-")]
    blocks = list(result.tas.data.dask.layers[name].values())
    assert len(blocks) == 4
    assert all(np.shares_memory(block, values) for block in blocks)
    assert not any(block.flags.writeable for block in blocks)  # no task writes into the input
    np.testing.assert_allclose(result.tas.values, ds.tas.median("time").values, rtol=1e-6)
    # a second apply is a graph of its own: its name is not the first one's
    again = ds.memchunk.apply("median", dim="time", chunks={"lon": 4})
    assert name not in again.tas.data.dask.layers


def test_a_user_function_writing_into_its_block_leaves_the_numpy_input_as_it_was(threaded):
    @xm.operator(register=False)
    def clip_in_place(block):
        np.clip(block, 250, 300, out=block)
        return block

    tas = synthetic_climate(40, 12, 16).tas  # numpy-backed
    before = tas.values.copy()
    result = tas.memchunk.apply(clip_in_place, chunks={"lon": 4}).values
    np.testing.assert_array_equal(tas.values, before)
    np.testing.assert_array_equal(result, np.clip(before, 250, 300))


def test_a_file_variable_read_without_dask_is_not_loaded_by_apply(tmp_path, threaded):
    path = tmp_path / "tas.nc"
    synthetic_climate(40, 12, 16).to_netcdf(path)
    with xr.open_dataset(path, cache=False) as ds:
        result = ds.memchunk.apply("median", dim="time", chunks={"lon": 4})
        assert not any(n.startswith("memchunk-in-memory-") for n in result.tas.data.dask.layers)
        np.testing.assert_allclose(result.tas.values, ds.tas.median("time").values, rtol=1e-6)


@pytest.mark.parametrize("as_dataarray", [False, True])
def test_a_file_opened_without_chunks_is_planned_without_reading_it(
    tmp_path, threaded, as_dataarray
):
    from xarray.core.indexing import NumpyIndexingAdapter

    path = tmp_path / "tas.nc"
    synthetic_climate(40, 12, 16).to_netcdf(path)
    with xr.open_dataset(path) as ds:  # no chunks: xarray reads lazily, and caches what it reads
        obj = ds.tas if as_dataarray else ds
        plan = obj.memchunk.plan("median", dim="time", memory_limit="1GB")
        assert "input read straight from its file: each task reads its own block" in plan.notes
        assert obj.memchunk.budget("1GB").per_task > 0
        # xarray's cache of the variable is still empty: nothing was read to plan
        assert not isinstance(ds.tas.variable._data.array, NumpyIndexingAdapter)
        result = plan.apply()
        assert not isinstance(ds.tas.variable._data.array, NumpyIndexingAdapter)
        values = (result if as_dataarray else result.tas).values
        np.testing.assert_allclose(values, ds.tas.median("time").values, rtol=1e-6)


def test_a_file_variable_the_plan_leaves_out_is_not_made_one_dask_chunk(tmp_path, threaded):
    path = tmp_path / "tas.nc"
    ds = synthetic_climate(40, 12, 16)
    ds["static"] = xr.DataArray(np.ones((12, 16)), dims=("lat", "lon"))  # no time: not reduced
    ds.to_netcdf(path)
    with xr.open_dataset(path) as src:
        result = src.memchunk.apply("median", dim="time", memory_limit="1GB")
        # as xarray's own median keeps it, not a single Dask chunk of the whole variable
        assert not isinstance(result.static.data, dask.array.Array)
        assert isinstance(result.tas.data, dask.array.Array)
        np.testing.assert_allclose(result.tas.values, src.tas.median("time").values, rtol=1e-6)


def test_dataset_variables_without_dims_are_left_out(threaded):
    ds = synthetic_seismic((30, 30, 30), chunks=30)
    ds["note"] = xr.DataArray(np.arange(3.0), dims="other")
    plan = ds.memchunk.plan("gst3d")
    assert any("not planned: note" in n for n in plan.notes)
    assert "note" not in ds.memchunk.apply("gst3d")


def test_not_an_xarray_object():
    with pytest.raises(xm.MemchunkError, match="Dataset and DataArray"):
        xm.plan(np.zeros(3), "mean")


def test_chunks_for_unknown_dim(volume):
    with pytest.raises(xm.DimensionError, match="lacks"):
        volume.memchunk.plan("gst3d", chunks={"depth": 10})


def test_budget_accessor(volume):
    b = volume.memchunk.budget("1GB")
    assert b.worker_memory == 10**9 and b.source.startswith("argument")
    assert str(b) == b.explain()  # print() shows the arithmetic, not the dataclass
    with pytest.raises(xm.BudgetError):
        volume.memchunk.budget("one gigabyte")


def smooth(block):
    return ndimage.uniform_filter(block, size=5, mode="reflect")


def test_user_defined_operator_end_to_end(threaded):
    op = xm.BlockwiseOperator(
        "test-smooth",
        smooth,
        memory_model=xm.LinearMemoryModel({"input_bytes": 3.0, "output_bytes": 1.0}),
        depth={"x": 2, "y": 2},
    )
    xm.register_operator(op, overwrite=True)
    assert "test-smooth" in xm.operator_names()
    rng = np.random.default_rng(1)
    da = xr.DataArray(rng.standard_normal((400, 300)).astype("float32"), dims=("x", "y"))
    budget = xm.Budget(
        worker_memory=10**9,
        threads_per_worker=1,
        n_workers=2,
        per_task=1_500_000,  # the whole array's task needs 1.92 MB
        source="test",
    )
    plan = da.memchunk.plan("test-smooth", budget=budget)
    assert plan.n_chunks > 1 and plan.halo == {"x": 2, "y": 2}
    assert plan.predicted_peak_bytes <= budget.per_task
    result = da.memchunk.apply("test-smooth", budget=budget)
    assert result.chunks is not None and len(result.chunks[0]) * len(result.chunks[1]) > 1
    np.testing.assert_array_equal(result.values, smooth(da.values))
    with pytest.raises(xm.MemchunkError, match="already registered"):
        xm.register_operator(op)


def test_user_operator_missing_dim():
    op = xm.BlockwiseOperator(
        "needs-z", smooth, memory_model=xm.LinearMemoryModel({}), depth={"z": 1}
    )
    with pytest.raises(xm.DimensionError, match="needs dims"):
        xr.DataArray(np.zeros((3, 3)), dims=("x", "y")).memchunk.plan(op)


def test_a_whole_dim_split_by_the_input_not_the_user_is_rechunked_without_a_caution():
    """A new user's trial: chunks={"lon": 20} warned "'time' must be one chunk ...; the given
    chunks split it in 20", though the split was the input's own, which any plan rechunks."""
    tas = synthetic_climate(200, 40, 60, chunks={"time": 10}).tas
    with warnings.catch_warnings():
        warnings.simplefilter("error", xm.MemoryBudgetWarning)
        plan = tas.memchunk.plan("median", dim="time", chunks={"lon": 20})
    assert plan.dask_chunks["time"] == (200,) and plan.dask_chunks["lon"] == (20, 20, 20)
    with pytest.warns(xm.MemoryBudgetWarning, match="'time' must be one chunk"):
        tas.memchunk.plan("median", dim="time", chunks={"time": 10, "lon": 20})


def test_variables_whose_models_differ_are_named_in_the_note():
    """A trial's Dataset note read "your calibration X, your calibration X, x1.31 learned":
    float32 and float64 variables shared a calibration, and runs had taught the float64 one."""
    from types import SimpleNamespace

    from xarray_memchunk.api import _model_sources

    plain, learned = "your calibration r.json", "your calibration r.json, x1.31 learned from runs"
    costs = {
        "tas": SimpleNamespace(model_source=plain),
        "pr": SimpleNamespace(model_source=learned),
        "sst": SimpleNamespace(model_source=learned),
    }
    assert _model_sources(costs) == f"tas: {plain}; pr, sst: {learned}"
    assert _model_sources({"tas": costs["tas"], "orog": costs["tas"]}) == plain

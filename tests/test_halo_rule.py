"""The halo rule: file data is planned as read with its halo by each task, and checked so.

An operator whose compute gathers neighbour chunks of file data inside the graph
(``map_overlap``, ``.rolling()``) is caught before anything runs; the built-in ``gst3d``, which
reads halos from the file (``map_blocks_with_halo``), is not.
"""

import inspect
import warnings

import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk import api
from xarray_memchunk._dask_compat import graph_layers, neighbour_gathering_layers
from xarray_memchunk.operators import DimUse, Operator, get_operator
from xarray_memchunk.operators.halo_rule import check_halo_reads, split_halo_dims
from xarray_memchunk.operators.sources import read_chunked
from xarray_memchunk.planning.problem import DimRole

SHAPE = (24, 24, 24)
DIMS = ("inline", "crossline", "sample")


def _smooth(block: np.ndarray) -> np.ndarray:
    return ndimage.uniform_filter(block, 3, mode="nearest")


class OverlapSmooth(Operator):
    """A 3-point smoothing over inline and crossline, its halos gathered by ``map_overlap``."""

    name = "test-overlap-smooth"

    def dims(self, da, **kwargs):
        return {d: DimUse(DimRole.HALO, 1) for d in ("inline", "crossline")}

    def cost(self, da, **kwargs):
        model = xm.LinearMemoryModel({"input_bytes": 3.0, "output_bytes": 1.0})
        return xm.Cost(self.name, xm.input_output_features(da.dtype.itemsize), model)

    def compute(self, da, uses, **kwargs):
        if da.chunks is None:
            return da.copy(data=_smooth(np.asarray(da)))
        depth = {da.get_axis_num(d): u.depth for d, u in uses.items()}
        data = da.data.map_overlap(_smooth, depth=depth, boundary="none", dtype=da.dtype)
        return da.copy(data=data)


class RollingMean(OverlapSmooth):
    """The same stencil as xarray's rolling mean over inline."""

    name = "test-rolling-mean"

    def dims(self, da, **kwargs):
        return {"inline": DimUse(DimRole.HALO, 1)}

    def compute(self, da, uses, **kwargs):
        return da.rolling(inline=3, center=True, min_periods=1).mean()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A 24^3 float32 volume in a Zarr store of 8^3 chunks, opened lazily."""
    path = tmp_path_factory.mktemp("halo") / "amp.zarr"
    values = np.random.default_rng(0).standard_normal(SHAPE, dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Zarr v3's consolidated metadata warning
        xr.Dataset({"amp": (DIMS, values)}).to_zarr(path, encoding={"amp": {"chunks": (8,) * 3}})
        ds = xr.open_zarr(path)
    yield ds
    ds.close()


def _planned(da, lengths):
    """``da`` read from its file in chunks of these lengths, as ``apply`` reads it."""
    chunks = {d: tuple(_split(da.sizes[d], lengths.get(d, da.sizes[d]))) for d in da.dims}
    return read_chunked(da, chunks)


def _split(size, length):
    return [min(length, size - start) for start in range(0, size, length)]


def test_map_overlap_on_file_data_is_caught(stored):
    op = OverlapSmooth()
    planned = _planned(stored.amp, {"inline": 8, "crossline": 8})
    uses = op.dims(planned)
    result = op.compute(planned, uses)
    with pytest.raises(xm.MemchunkError, match="map_blocks_with_halo") as caught:
        check_halo_reads(result, planned, {"amp": uses}, op.name)
    message = str(caught.value)
    assert "test-overlap-smooth" in message and "'amp'" in message and "overlap-" in message
    assert "'inline', 'crossline'" in message


def test_rolling_on_file_data_is_caught(stored):
    op = RollingMean()
    planned = _planned(stored.amp, {"inline": 8})
    uses = op.dims(planned)
    with pytest.raises(xm.MemchunkError, match="rolling"):
        check_halo_reads(op.compute(planned, uses), planned, {"amp": uses}, op.name)


def test_a_dataset_is_checked_per_planned_variable(stored):
    op = OverlapSmooth()
    planned = stored.assign(amp=_planned(stored.amp, {"inline": 8, "crossline": 8}))
    uses = {"amp": op.dims(planned.amp)}
    result = op.compute_dataset(planned, uses)
    with pytest.raises(xm.MemchunkError, match="variable 'amp'"):
        check_halo_reads(result, planned, uses, op.name)


def test_gst3d_on_file_data_reads_its_halos_from_the_file(stored):
    op = get_operator("gst3d")
    planned = _planned(stored.amp, {"inline": 12, "crossline": 12, "sample": 12})
    kwargs = op.check_arguments(op.check_arguments({}), planned)
    uses = op.dims(planned, **kwargs)
    assert split_halo_dims(planned, uses) == list(DIMS)
    result = op.compute(planned, uses, **kwargs)
    check_halo_reads(result, planned, {"amp": uses}, op.name)  # no error
    assert neighbour_gathering_layers(result, graph_layers(result)) == []


def test_gst3d_applied_to_a_zarr_input_gathers_no_neighbours(stored):
    chunks = {"inline": 12, "crossline": 12, "sample": 12}
    result = xm.apply(stored, "gst3d", chunks=chunks, memory_limit="4GB")
    assert neighbour_gathering_layers(result, graph_layers(result)) == []


def test_graph_data_and_unsplit_halo_dims_pass(stored):
    op = OverlapSmooth()
    # data produced by a graph: its plan counts the neighbour chunks a stencil holds
    produced = (stored.amp * 2).chunk({"inline": 8, "crossline": 8, "sample": 24})
    uses = op.dims(produced)
    check_halo_reads(op.compute(produced, uses), produced, {"amp": uses}, op.name)
    # file data whose halo dims are one chunk each: there is no neighbour to gather
    whole = _planned(stored.amp, {"sample": 8})
    assert split_halo_dims(whole, uses) == []
    check_halo_reads(op.compute(whole, uses), whole, {"amp": uses}, op.name)
    # NumPy data
    values = stored.amp.compute()
    check_halo_reads(op.compute(values, uses), values, {"amp": uses}, op.name)


@pytest.mark.skipif(
    "check_halo_reads" not in inspect.getsource(api),
    reason="api.apply does not call check_halo_reads yet",
)
def test_apply_refuses_an_operator_that_breaks_the_rule(stored):
    with pytest.raises(xm.MemchunkError, match="map_blocks_with_halo"):
        xm.apply(stored, OverlapSmooth(), chunks={"inline": 8, "crossline": 8}, memory_limit="4GB")

"""Direct reads of a local Zarr array's chunk files: the values are always zarr's own."""

from __future__ import annotations

import pickle

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

from xarray_memchunk.operators.sources import BoundedReads, file_backend
from xarray_memchunk.operators.zarr_reads import (
    DirectChunkReads,
    direct_reader,
    with_direct_zarr_reads,
)

SHAPE = (23, 17, 30)
CHUNKS = (4, 5, 30)
#: Ranges along each axis: inside one chunk, across chunks, the array's edge, all, empty.
REGIONS = [
    (slice(0, 23), slice(0, 17), slice(0, 30)),
    (slice(1, 3), slice(2, 4), slice(5, 9)),
    (slice(3, 21), slice(4, 16), slice(0, 30)),
    (slice(20, 23), slice(15, 17), slice(29, 30)),
    (slice(4, 8), slice(0, 17), slice(0, 30)),
    (slice(None, None), slice(6, 6), slice(None)),
]


def _values(dtype: str = "float32") -> np.ndarray:
    values = np.random.default_rng(0).standard_normal(SHAPE) * 100
    return values.astype(dtype)


def _written(path, values, **kwargs) -> zarr.Array:
    array = zarr.create_array(
        store=str(path), shape=values.shape, chunks=CHUNKS, dtype=values.dtype, **kwargs
    )
    array[...] = values
    return zarr.open_array(str(path), mode="r")


LAYOUTS = {
    "zarr3-zstd": {"compressors": [ZstdCodec(level=1)]},
    "zarr3-blosc": {"compressors": [BloscCodec(cname="lz4", shuffle="bitshuffle")]},
    "zarr3-gzip": {"compressors": [GzipCodec()]},
    "zarr3-raw": {"compressors": None},
    "zarr2-zstd": {"compressors": numcodecs.Zstd(level=3), "zarr_format": 2},
    "zarr2-blosc": {"compressors": numcodecs.Blosc(cname="zstd"), "zarr_format": 2},
    "zarr2-raw": {"compressors": None, "zarr_format": 2},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "int16", "float64"])
def test_direct_reads_equal_zarr(tmp_path, layout, dtype):
    array = _written(tmp_path / "a.zarr", _values(dtype), **LAYOUTS[layout])
    direct = DirectChunkReads.of(array)
    assert direct is not None, f"{layout} should be read directly"
    for region in REGIONS:
        got = direct[region]
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array[region])


def test_direct_reads_survive_pickling(tmp_path):
    array = _written(tmp_path / "a.zarr", _values(), **LAYOUTS["zarr3-zstd"])
    direct = pickle.loads(pickle.dumps(DirectChunkReads.of(array)))
    np.testing.assert_array_equal(direct[REGIONS[2]], array[REGIONS[2]])
    assert direct.shape == array.shape  # the array's attributes, through the reader


@pytest.mark.parametrize(
    "key",
    [
        (3, slice(None), slice(None)),
        (slice(0, 20, 3), slice(None), slice(None)),
        5,
        slice(2, 9),  # ranges as NumPy reads them: missing axes and Ellipsis are whole
        (Ellipsis, slice(4, 7)),
        (slice(1, 5), Ellipsis),
        Ellipsis,
    ],
)
def test_other_selections_are_zarrs_own(tmp_path, key):
    array = _written(tmp_path / "a.zarr", _values(), **LAYOUTS["zarr3-zstd"])
    np.testing.assert_array_equal(DirectChunkReads.of(array)[key], array[key])


def test_a_0d_array_reads_as_zarr_reads_it(tmp_path):
    array = zarr.create_array(store=str(tmp_path / "s.zarr"), shape=(), dtype="float64")
    array[()] = 3.5
    direct = DirectChunkReads.of(zarr.open_array(str(tmp_path / "s.zarr"), mode="r"))
    for key in [(), Ellipsis]:
        assert float(direct[key]) == 3.5


def test_a_chunk_never_written_reads_as_the_fill_value(tmp_path):
    values = _values()
    values[4:8] = -1.0  # one row of chunks equal to the fill value: not written
    array = _written(
        tmp_path / "a.zarr",
        values,
        fill_value=-1.0,
        config={"write_empty_chunks": False},
        **LAYOUTS["zarr3-zstd"],
    )
    direct = DirectChunkReads.of(array)
    for region in REGIONS:
        np.testing.assert_array_equal(direct[region], values[region])
    xr.DataArray(values, dims=("t", "y", "x"), name="v").to_dataset().to_zarr(
        tmp_path / "v.zarr",
        encoding={"v": {"chunks": CHUNKS, "_FillValue": -1.0, **LAYOUTS["zarr3-zstd"]}},
    )
    zarr.open_array(str(tmp_path / "v.zarr" / "v"), mode="r+")[4:8] = -1.0  # files kept
    for key in zarr.storage.LocalStore(str(tmp_path / "v.zarr")).root.glob("v/c/1/*/*"):
        key.unlink()  # the chunks of rows 4-7: never written
    opened = xr.open_zarr(tmp_path / "v.zarr", mask_and_scale=False)["v"]
    reads = BoundedReads(file_backend(opened.data), CHUNKS, max_bytes=2_000)
    assert reads.direct is not None
    by_zarr = zarr.open_array(str(tmp_path / "v.zarr" / "v"), mode="r")
    for region in REGIONS:  # the direct read stops at the missing file; zarr reads the region
        np.testing.assert_array_equal(reads[region], by_zarr[region])
    assert np.isnan(reads[REGIONS[4]]).all()  # zarr's fill value, NaN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"compressors": [ZstdCodec(checksum=True)]},
        {"shards": (8, 10, 30)},
        {"filters": [numcodecs.Delta(dtype="<f4")], "compressors": None, "zarr_format": 2},
        {"compressors": None, "zarr_format": 2, "order": "F"},
    ],
    ids=["checksum", "sharded", "zarr2-filter", "zarr2-fortran"],
)
def test_other_layouts_are_left_to_zarr(tmp_path, kwargs):
    array = _written(tmp_path / "a.zarr", _values(), **kwargs)
    assert DirectChunkReads.of(array) is None


def test_big_endian_is_left_to_zarr(tmp_path):
    array = _written(tmp_path / "a.zarr", _values(">f4"), compressors=None, zarr_format=2)
    assert DirectChunkReads.of(array) is None


def test_a_decoded_variable_reads_as_xarray_reads_it(tmp_path):
    """Packed int16 with scale, offset and a fill value: xarray's decoding stays on top."""
    values = _values("float64")
    values[0, 0, :5] = np.nan
    da = xr.DataArray(values, dims=("time", "lat", "lon"), name="tas")
    encoding = {
        "dtype": "int16",
        "scale_factor": 0.01,
        "add_offset": 5.0,
        "_FillValue": -32768,
        "chunks": CHUNKS,
    }
    da.to_dataset().to_zarr(tmp_path / "c.zarr", encoding={"tas": encoding})
    opened = xr.open_zarr(tmp_path / "c.zarr")["tas"]
    backend = file_backend(opened.data)
    reads = BoundedReads(backend, CHUNKS)
    assert reads.array is not backend  # a copy with direct reads under xarray's wrappers
    assert reads.direct is None  # decoded: read through the wrappers
    for region in REGIONS:
        np.testing.assert_array_equal(reads[region], opened.values[region])


def test_the_variables_own_wrappers_are_left_as_they_are(tmp_path):
    xr.DataArray(_values(), dims=("t", "y", "x"), name="v").to_dataset().to_zarr(
        tmp_path / "d.zarr", encoding={"v": {"chunks": CHUNKS}}
    )
    backend = file_backend(xr.open_zarr(tmp_path / "d.zarr")["v"].data)
    direct = with_direct_zarr_reads(backend)
    node = backend
    while not hasattr(node, "_array"):
        node = node.array
    assert isinstance(node._array, zarr.Array)  # the original still reads through zarr
    assert with_direct_zarr_reads(direct) is direct  # already direct: unchanged
    np.testing.assert_array_equal(np.asarray(direct[REGIONS[2]]), np.asarray(backend[REGIONS[2]]))


def _plain(tmp_path, **encoding) -> xr.DataArray:
    xr.DataArray(_values(), dims=("t", "y", "x"), name="v").to_dataset().to_zarr(
        tmp_path / "p.zarr", encoding={"v": {"chunks": CHUNKS, **encoding}}
    )
    return xr.open_zarr(tmp_path / "p.zarr")["v"]


@pytest.mark.parametrize("layout", ["zarr3-zstd", "zarr3-raw"])
def test_a_plain_variable_is_read_straight_into_the_block(tmp_path, monkeypatch, layout):
    """No group reads, no copy: one direct read per region, into the caller's array."""
    opened = _plain(tmp_path, **LAYOUTS[layout])
    values = opened.values
    reads = BoundedReads(file_backend(opened.data), CHUNKS, max_bytes=2_000)  # groups of 1
    assert reads.direct is not None
    calls = []
    read_into = DirectChunkReads.read_into
    monkeypatch.setattr(
        DirectChunkReads, "read_into", lambda self, r, o: calls.append(r) or read_into(self, r, o)
    )
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda self, key: pytest.fail("zarr read"))
    for region in REGIONS:
        np.testing.assert_array_equal(reads[region], values[region])
        out = np.full(values[region].shape, 7.0, dtype="float32")
        reads.read_into(region, out)
        np.testing.assert_array_equal(out, values[region])
    assert len(calls) == 2 * sum(1 for r in REGIONS if r[1].start != r[1].stop)
    out = np.empty((4, 5, 30), "float32")
    reads.read_into((slice(4, 8), slice(5, 10), slice(0, 30)), out)  # one whole chunk
    np.testing.assert_array_equal(out, values[4:8, 5:10])


def test_a_selection_or_decoding_keeps_xarrays_wrappers(tmp_path):
    from xarray.core.indexing import BasicIndexer, LazilyIndexedArray

    backend = with_direct_zarr_reads(file_backend(_plain(tmp_path).data))
    assert isinstance(direct_reader(backend), DirectChunkReads)
    inner = backend
    while not isinstance(inner, LazilyIndexedArray):
        inner = inner.array
    whole = LazilyIndexedArray(inner.array, BasicIndexer((slice(None),) * 3))
    assert isinstance(direct_reader(whole), DirectChunkReads)
    some = LazilyIndexedArray(inner.array, BasicIndexer((slice(2, 9), slice(None), slice(None))))
    assert direct_reader(some) is None
    assert direct_reader(np.zeros(3)) is None


def test_a_damaged_raw_chunk_file_is_an_error_not_values(tmp_path):
    array = _written(tmp_path / "a.zarr", _values(), **LAYOUTS["zarr3-raw"])
    path = tmp_path / "a.zarr" / "c" / "1" / "0" / "0"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="damaged"):
        DirectChunkReads.of(array)[4:8, 0:5]


def test_a_missing_chunk_is_read_by_zarr_into_the_same_block(tmp_path):
    """The fallback fills the block the direct read began: one block held, not two."""
    import tracemalloc

    values = np.random.default_rng(1).standard_normal((80, 50, 30)).astype("float32")
    values[76:] = np.nan  # zarr writes no file for chunks all of the fill value
    xr.DataArray(values, dims=("t", "y", "x"), name="v").to_dataset().to_zarr(
        tmp_path / "m.zarr", encoding={"v": {"chunks": CHUNKS}}
    )
    opened = xr.open_zarr(tmp_path / "m.zarr")["v"]
    assert not list((tmp_path / "m.zarr" / "v" / "c").glob("19/*/*"))  # rows 76-79: no files
    reads = BoundedReads(file_backend(opened.data), CHUNKS, max_bytes=9600)
    assert reads.direct is not None
    region = (slice(0, 80), slice(0, 50), slice(0, 30))
    tracemalloc.start()
    try:
        got = reads[region]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, values)
    assert peak < 1.5 * values.nbytes, f"{peak / values.nbytes:.2f} x the block"


def test_read_into_an_array_of_another_dtype_casts_as_numpy_does(tmp_path):
    opened = _plain(tmp_path, **LAYOUTS["zarr3-zstd"])
    reads = BoundedReads(file_backend(opened.data), CHUNKS)
    out = np.zeros((4, 5, 30), "float64")
    reads.read_into((slice(0, 4), slice(0, 5), slice(0, 30)), out)
    np.testing.assert_array_equal(out, opened.values[:4, :5].astype("float64"))

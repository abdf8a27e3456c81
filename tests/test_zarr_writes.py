"""Direct writes of an uncompressed local Zarr array's chunk files: zarr reads back what went in."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from xarray_memchunk.operators.staged_zarr import StagedStore
from xarray_memchunk.operators.zarr_reads import DirectChunkReads
from xarray_memchunk.operators.zarr_writes import (
    DirectChunkWrites,
    copies_directly,
    copy_region,
)

SHAPE = (37, 10, 13)
#: Edge chunks on every axis.
CHUNKS = (10, 4, 5)


def _values(dtype: str = "float32") -> np.ndarray:
    return (np.random.default_rng(2).standard_normal(SHAPE) * 100).astype(dtype)


def _empty(path, dtype="float32", chunks=CHUNKS, **kwargs) -> zarr.Array:
    kwargs.setdefault("compressors", None)
    return zarr.create_array(
        store=str(path), shape=SHAPE, chunks=chunks, dtype=dtype, fill_value=0, **kwargs
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "int16", "complex64"])
def test_slabs_written_by_several_writers_read_back_as_zarr_wrote_them(
    tmp_path, zarr_format, dtype
):
    values = _values("float64").astype(dtype)
    array = _empty(tmp_path / "a.zarr", dtype, zarr_format=zarr_format)
    # slabs that start and end inside chunks along the first axis, as write tasks of 7 and
    # 16 steps cut chunks of 10; each writer its own object, as each task unpickles one
    for start, stop in [(0, 7), (7, 23), (23, 37)]:
        writer = pickle.loads(pickle.dumps(DirectChunkWrites.of(array)))
        writer[start:stop] = values[start:stop]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], values)
    reference = _empty(tmp_path / "b.zarr", dtype, zarr_format=zarr_format)
    reference[...] = values
    # the chunk files are zarr's own, edge chunks at the chunk's shape
    for name in ("c/3/2/2", "c/0/0/0") if zarr_format == 3 else ("3.2.2", "0.0.0"):
        written = (tmp_path / "a.zarr" / name).stat().st_size
        assert written == (tmp_path / "b.zarr" / name).stat().st_size


def test_a_region_whole_along_all_but_the_first_axis_is_written_directly(tmp_path):
    values = _values()
    array = _empty(tmp_path / "a.zarr")
    writer = DirectChunkWrites.of(array)
    region = (slice(3, 15), slice(4, 10), slice(5, 13))  # to the array's end on the last two
    assert writer.writable(region)
    writer.write(region, values[region])
    expected = np.zeros(SHAPE, "float32")
    expected[region] = values[region]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], expected)


def test_a_region_that_cuts_a_chunk_along_another_axis_is_refused(tmp_path):
    """zarr would read, change and write whole chunk files, losing other writers' slabs."""
    writer = DirectChunkWrites.of(_empty(tmp_path / "a.zarr"))
    region = (slice(0, 37), slice(1, 3), slice(0, 13))
    assert not writer.writable(region)
    with pytest.raises(ValueError, match="not slabs of whole chunks"):
        writer[region] = _values()[region]


def test_a_block_of_another_dtype_is_cast_as_zarr_casts_it(tmp_path):
    values = _values("float64")
    writer = DirectChunkWrites.of(_empty(tmp_path / "a.zarr"))
    writer[0:37] = values
    np.testing.assert_array_equal(
        zarr.open_array(str(tmp_path / "a.zarr"))[...], values.astype("float32")
    )


def test_layouts_whose_files_are_not_the_chunks_bytes_are_not_written_directly(tmp_path):
    assert DirectChunkWrites.of(_empty(tmp_path / "raw.zarr")) is not None
    compressed = _empty(tmp_path / "zstd.zarr", compressors=[ZstdCodec()])
    assert DirectChunkWrites.of(compressed) is None
    big_endian = _empty(tmp_path / "big.zarr", ">f4", zarr_format=2)
    assert DirectChunkWrites.of(big_endian) is None


@pytest.mark.parametrize("source_chunks", [(1, 10, 13), (3, 4, 10), (2, 8, 5)])
def test_copy_region_decodes_the_source_chunk_by_chunk_into_the_targets_slabs(
    tmp_path, source_chunks
):
    values = _values()
    source = _empty(tmp_path / "s.zarr", chunks=source_chunks, compressors=[ZstdCodec()])
    source[...] = values
    source[4:6] = 0  # chunks equal to the fill value are not written: zarr reads them
    values[4:6] = 0
    reader = DirectChunkReads.of(zarr.open_array(str(tmp_path / "s.zarr"), mode="r"))
    target = _empty(tmp_path / "t.zarr", chunks=(37, 4, 5))
    writer = DirectChunkWrites.of(target)
    assert copies_directly(reader, writer)
    for start in range(0, 37, 6):  # write tasks of 6 steps, each its slab of every chunk
        copy_region(reader, writer, (slice(start, min(start + 6, 37)), slice(0, 10), slice(0, 13)))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "t.zarr"))[...], values)


def test_a_source_chunk_that_cuts_a_target_chunk_is_not_copied_directly(tmp_path):
    _empty(tmp_path / "s.zarr", chunks=(1, 3, 13))
    target = _empty(tmp_path / "t.zarr", chunks=(37, 4, 5))
    reader = DirectChunkReads.of(zarr.open_array(str(tmp_path / "s.zarr"), mode="r"))
    assert not copies_directly(reader, DirectChunkWrites.of(target))


def test_a_staged_chunk_is_read_as_its_mapped_file_and_writes_stay_in_the_block(tmp_path):
    values = _values()
    array = _empty(tmp_path / "a.zarr", chunks=(20, 10, 13))
    array[...] = values
    staged = zarr.open_array(StagedStore(tmp_path / "a.zarr", read_only=True), mode="r")
    reader = DirectChunkReads.of(staged)
    whole = (slice(0, 20), slice(0, 10), slice(0, 13))
    block = reader.mapped(whole)
    assert block is not None and block.flags.writeable
    np.testing.assert_array_equal(block, values[:20])
    edge = reader.mapped((slice(20, 37), slice(0, 10), slice(0, 13)))  # cut short at the end
    np.testing.assert_array_equal(edge, values[20:])
    block[...] = 0  # copy-on-write: the file keeps its values
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[:20], values[:20])
    assert reader.mapped((slice(0, 10), slice(0, 10), slice(0, 13))) is None  # part of a chunk
    # a store users hold may change under a mapped block: theirs are read, not mapped
    plain = DirectChunkReads.of(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"))
    assert plain.mapped(whole) is None

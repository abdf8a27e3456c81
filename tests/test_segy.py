"""SEG-Y in: open_segy against segyio's own reader, missing traces, bad files, ingest to Zarr."""

import subprocess
import sys
import warnings

import cf_xarray  # noqa: F401  (the .cf accessor)
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_seismic
from xarray_memchunk.io import open_input, open_segy, write_segy
from xarray_memchunk.operators.sources import input_kind
from xarray_memchunk.planning.footprint import InputKind
from xarray_memchunk.seismic import segy
from xarray_memchunk.seismic.ingest import DEFAULT_CHUNK, ingest, storage_chunks_for, write_chunks

segyio = pytest.importorskip("segyio")

MEMCHUNK = [sys.executable, "-m", "xarray_memchunk.cli"]


def memchunk(*args, timeout=300):
    return subprocess.run(
        [*MEMCHUNK, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def volume():
    return synthetic_seismic((30, 26, 40), dip_degrees=25).amplitude


@pytest.fixture(scope="module")
def volume_file(volume, tmp_path_factory):
    path = tmp_path_factory.mktemp("segy") / "volume.sgy"
    return write_segy(volume, path, first_inline=1001, first_crossline=2001)


def segyio_cube(path, endian="big"):
    with segyio.open(str(path), endian=endian) as f:
        cube = segyio.tools.cube(f)
        sorting = f.sorting
    # segyio gives (slow, fast, samples): (crossline, inline, ...) for a crossline-sorted file
    return (
        cube.transpose(1, 0, 2) if sorting == segyio.TraceSortingFormat.CROSSLINE_SORTING else cube
    )


@pytest.mark.parametrize("sorting", ["inline", "crossline"])
@pytest.mark.parametrize("endian", ["big", "little"])
@pytest.mark.parametrize(("sample_format", "dtype"), [(1, "float32"), (3, "int16"), (5, "float32")])
def test_values_equal_segyio_cube(volume, tmp_path, sample_format, dtype, endian, sorting):
    amplitudes = volume * 1000 if dtype == "int16" else volume
    path = write_segy(
        amplitudes, tmp_path / "v.sgy", sample_format=sample_format, endian=endian, sorting=sorting
    )
    da = open_segy(path)  # endian="auto" finds the byte order
    assert da.dtype == np.dtype(dtype)
    assert da.attrs["segy_endian"] == endian
    assert da.attrs["segy_sorting"] == f"{sorting}-sorted"
    np.testing.assert_array_equal(da.values, segyio_cube(path, endian))
    # IBM floats round float32 amplitudes (7 significant bits of mantissa lost at most)
    tolerance = {1: 1e-6, 3: 0.5, 5: 0.0}[sample_format]
    np.testing.assert_allclose(da.values, amplitudes.values, rtol=0, atol=tolerance)


def test_coordinates_and_attributes_from_headers(volume_file, volume):
    da = open_segy(volume_file)
    assert da.dims == ("inline", "crossline", "sample") and da.name == "amplitude"
    np.testing.assert_array_equal(da.inline, np.arange(1001, 1031))
    np.testing.assert_array_equal(da.crossline, np.arange(2001, 2027))
    np.testing.assert_array_equal(da.sample, np.arange(40) * 4.0)
    assert da.sample.attrs["units"] == "ms" and da.sample.attrs["axis"] == "Z"
    assert da.inline.attrs["axis"] == "X" and da.crossline.attrs["axis"] == "Y"
    assert da.cf.axes == {"X": ["inline"], "Y": ["crossline"], "Z": ["sample"]}
    depth = open_segy(volume_file, domain="depth")
    assert depth.sample.attrs["standard_name"] == "depth" and "units" not in depth.sample.attrs
    with pytest.raises(xm.MemchunkError, match="domain"):
        open_segy(volume_file, domain="frequency")


def test_lazy_and_read_from_the_file_by_runs_of_traces(volume_file, monkeypatch):
    da = open_segy(volume_file)
    assert da.chunks == ((1,) * 30, (26,), (40,))  # one inline per chunk: nothing read yet
    assert input_kind(da) is InputKind.FILE
    reads = []
    real_open = segy._open

    class Spy:
        def __init__(self, f):
            self.f, self.trace = f, self

        @property
        def raw(self):
            return self

        def __getitem__(self, key):
            reads.append(key.stop - key.start)
            return self.f.trace.raw[key]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(segy, "_open", lambda *a: Spy(real_open(*a)))
    block = da.isel(inline=slice(4, 7), crossline=slice(10, 15), sample=slice(5, 20)).values
    assert reads == [5, 5, 5]  # three inlines, one run of five traces each
    assert block.shape == (3, 5, 15)


def test_gst3d_on_segy_equals_gst3d_in_memory(volume_file, threaded):
    da = open_segy(volume_file)
    plan = da.memchunk.plan("gst3d", memory_limit="1GB")
    assert "read straight from its file" in plan.explain()
    dip = da.memchunk.apply("gst3d", memory_limit="1GB", sigma=1.0, rho=1.5)
    expected = da.load().memchunk.apply("gst3d", sigma=1.0, rho=1.5)
    np.testing.assert_allclose(dip.values, expected.values, rtol=1e-5, atol=1e-4)
    assert dip.name == "dip"


def test_missing_traces_refused_or_filled_with_a_mask(volume, tmp_path):
    present = np.ones((30, 26), bool)
    present[:4, :3] = False  # an irregular outline
    present[15, 12] = False  # a gap
    path = write_segy(volume, tmp_path / "holes.sgy", trace_present=present)
    with pytest.raises(xm.MemchunkError, match=r"13 missing traces.*fill="):
        open_segy(path)
    da = open_segy(path, fill=np.nan)
    np.testing.assert_array_equal(da.trace_present.values, present)
    expected = np.where(present[..., None], volume.values, np.nan)
    np.testing.assert_array_equal(da.values, expected)
    ints = write_segy(
        volume * 1000, tmp_path / "holes16.sgy", sample_format=3, trace_present=present
    )
    assert open_segy(ints, fill=np.nan).dtype == np.float32  # NaN needs floats
    assert open_segy(ints, fill=-999).values[0, 0, 0] == -999
    with pytest.raises(xm.MemchunkError, match="not a value of the file's int16"):
        open_segy(ints, fill=1.5)


def test_a_file_that_states_no_sample_interval_is_said_so(volume, tmp_path):
    """A trial: an interval of 0 got segyio's 4 ms steps, silently."""
    import segyio

    path = write_segy(volume, tmp_path / "dt0.sgy")
    with segyio.open(path, "r+", ignore_geometry=True) as f:
        f.bin.update({segyio.BinField.Interval: 0})
        for trace in range(f.tracecount):
            f.header[trace] = {segyio.TraceField.TRACE_SAMPLE_INTERVAL: 0}
    with pytest.warns(UserWarning, match="states no sample interval"):
        da = open_segy(path)
    assert da.sample.values[1] - da.sample.values[0] == 4.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_segy(write_segy(volume, tmp_path / "dt4.sgy"))  # an interval stated: no warning


def test_cli_run_and_plan_fill_missing_traces_as_ingest_does(volume, tmp_path):
    """A trial: the refusal pointed to --fill, which only `ingest` took."""
    present = np.ones((30, 26), bool)
    present[15, 12] = False
    path = write_segy(volume, tmp_path / "holes.sgy", trace_present=present)
    args = ["--nworkers", "1", "--memory-limit", "1GB"]
    refused = memchunk("run", "mean", path, tmp_path / "m.zarr", "--dim", "sample", *args)
    assert refused.returncode == 2 and "--fill nan" in refused.stderr
    filled = memchunk(
        "run", "mean", path, tmp_path / "m.zarr", "--dim", "sample", "--fill", "nan", *args
    )
    assert filled.returncode == 0, filled.stderr
    mean = xr.open_zarr(tmp_path / "m.zarr")["amplitude"].values
    assert np.isnan(mean[15, 12]) and np.isfinite(np.delete(mean.ravel(), 15 * 26 + 12)).all()
    planned = memchunk("plan", "mean", path, "--dim", "sample", "--fill", "nan", *args)
    assert planned.returncode == 0, planned.stderr
    not_segy = memchunk("plan", "mean", tmp_path / "m.zarr", "--dim", "lat", "--fill", "0")
    assert not_segy.returncode == 2 and "not a SEG-Y file" in not_segy.stderr


def test_duplicate_positions_and_bad_files_refused(volume, tmp_path):
    path = write_segy(volume, tmp_path / "v.sgy")
    with pytest.raises(xm.MemchunkError, match="several traces share"):
        open_segy(path, xline=9)  # a header field (field record) that is 0 on every trace
    (tmp_path / "zeros.sgy").write_bytes(bytes(5000))
    (tmp_path / "text.sgy").write_text("not seismic\n" * 400)
    truncated = tmp_path / "truncated.sgy"
    truncated.write_bytes(path.read_bytes()[:-1000])
    for bad in ("zeros.sgy", "text.sgy", "truncated.sgy"):
        with pytest.raises(xm.MemchunkError, match=r"cannot read .* as SEG-Y"):
            open_segy(tmp_path / bad)
    with pytest.raises(xm.MemchunkError, match="does not exist"):
        open_segy(tmp_path / "missing.sgy")
    with pytest.raises(xm.MemchunkError, match="cannot read"):
        open_segy(path, endian="little")  # a big-endian file read as little-endian


def test_segy_without_traces_is_one_line(volume_file, tmp_path):
    empty = tmp_path / "empty.sgy"
    empty.write_bytes(volume_file.read_bytes()[: segy.FILE_HEADER_BYTES])  # headers only
    with pytest.raises(xm.MemchunkError, match="it has no traces"):
        open_segy(empty)
    for args in (["plan", "gst3d", empty], ["ingest", empty, tmp_path / "out.zarr"]):
        result = memchunk(*args)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"memchunk: error: cannot read {str(empty)!r} as SEG-Y: it has no traces (3600 "
            f"bytes: the file headers take 3600, and each trace 240 more plus its samples)"
        ]


def test_written_headers_are_the_standard_ones_other_readers_need(volume, tmp_path):
    """Issue 32: MDIO refused write_segy's files ("Invalid coordinate scalar: 0")."""
    path = write_segy(volume, tmp_path / "v.sgy", first_inline=11, origin=(450_000.0, 6_700_000.5))
    field, binary = segyio.TraceField, segyio.BinField
    with segyio.open(str(path)) as f:
        assert f.bin[binary.SEGYRevision] == 1 and f.bin[binary.SEGYRevisionMinor] == 0
        assert f.bin[binary.MeasurementSystem] == 1  # metres
        assert f.bin[binary.TraceFlag] == 1  # fixed trace length
        assert f.bin[binary.ExtendedHeaders] == 0
        text = bytes(f.text[0]).decode("ascii", "replace")
        assert "INLINE BYTES 189-192" in text and "CDP X BYTES 181-184" in text
        n_xl = volume.shape[1]
        for trace in (0, 1, n_xl, len(f.trace) - 1):
            il, xl = divmod(trace, n_xl)
            h = f.header[trace]
            assert h[field.SourceGroupScalar] == -100  # centimetres: MDIO needs it non-zero
            assert h[field.CDP_X] / 100 == 450_000.0 + 25.0 * xl
            assert h[field.CDP_Y] / 100 == 6_700_000.5 + 25.0 * il
            assert (h[field.INLINE_3D], h[field.CROSSLINE_3D]) == (11 + il, 1 + xl)
            assert h[field.TRACE_SEQUENCE_FILE] == trace + 1
            assert h[field.TraceIdentificationCode] == 1


def test_write_segy_refuses_what_it_cannot_write(volume, tmp_path):
    with pytest.raises(xm.MemchunkError, match="coordinate_scalar must be one of"):
        write_segy(volume, tmp_path / "v.sgy", coordinate_scalar=0)
    with pytest.raises(xm.MemchunkError, match="do not fit SEG-Y's 4-byte integers"):
        write_segy(volume, tmp_path / "v.sgy", origin=(1e8, 0.0))
    with pytest.raises(xm.MemchunkError, match="do not fit format 8"):
        write_segy(volume * 1000, tmp_path / "v.sgy", sample_format=8)
    with pytest.raises(xm.MemchunkError, match="sample_format must be one of"):
        write_segy(volume, tmp_path / "v.sgy", sample_format=4)


def test_storage_chunks_for_an_operator_are_what_its_plan_reads(volume_file, tmp_path):
    da = open_segy(volume_file)
    chunks, reason = storage_chunks_for(da, "gst3d", memory_limit="500MB")
    assert "gst3d's planned chunks" in reason
    target, written, _ = ingest(
        volume_file, tmp_path / "v.zarr", operator="gst3d", memory_limit="500MB"
    )
    assert written == chunks
    store = open_input(target, "amplitude")
    assert store.encoding["chunks"] == tuple(chunks[d] for d in store.dims)
    for measure in ("never", "auto"):
        plan = store.memchunk.plan("gst3d", memory_limit="500MB", measure=measure)
        assert plan.chunks == chunks and plan.storage_aligned
    np.testing.assert_array_equal(store.values, segyio_cube(volume_file))
    np.testing.assert_array_equal(store.inline, da.inline)
    default, _, why = ingest(volume_file, tmp_path / "d.zarr", memory_limit="500MB")
    assert "128 along every dim" in why
    assert open_input(default, "amplitude").encoding["chunks"] == (30, 26, 40)  # capped


def test_storage_chunks_for_a_built_in_operator_measure_no_reads(volume_file, monkeypatch):
    from xarray_memchunk.operators import read_once

    def probe(*args, **kwargs):
        raise AssertionError("the SEG-Y file was timed as if it were the store")

    monkeypatch.setattr(read_once, "storage_read_seconds", probe)
    _, reason = storage_chunks_for(open_segy(volume_file), "gst3d", memory_limit="500MB")
    assert "gst3d's planned chunks" in reason


def test_write_chunks_are_whole_storage_chunks_within_the_budget():
    sizes = {"inline": 1000, "crossline": 900, "sample": 1500}
    storage = dict.fromkeys(sizes, DEFAULT_CHUNK)
    chunks = write_chunks(sizes, storage, 4, per_task=400 * 2**20, along="sample")
    assert chunks["inline"][:-1] == (128,) * 7 and chunks["inline"][-1] == 1000 - 7 * 128
    assert chunks["sample"] == (1500,)  # a whole column of traces fits
    small = write_chunks(sizes, storage, 4, per_task=40 * 2**20, along="sample")
    assert set(small["sample"][:-1]) == {128} and sum(small["sample"]) == 1500
    assert 128 * 128 * 128 * 4 * 4 <= 40 * 2**20


def test_cli_ingest_for_an_operator_states_its_minimum_where_no_task_fits(volume_file, tmp_path):
    """A new user's `memchunk ingest v.sgy v.zarr --for gst3d --memory-limit 50MB` was told "at
    least 238.42 MiB", room for a task, and then "at least 419.30 MiB" there."""
    import re

    def ingest_at(limit):
        args = ["--for", "gst3d", "--nworkers", "1", "--memory-limit", limit]
        return memchunk("ingest", volume_file, tmp_path / f"{limit}.zarr", *args)

    refused = ingest_at("50MB")
    assert refused.returncode == 2, refused.stdout
    figures = set(re.findall(r"at least (\S+ \S+) \(memory_limit\)", refused.stderr))
    assert len(figures) == 1, refused.stderr
    written = ingest_at(figures.pop().replace(" ", ""))
    assert written.returncode == 0, written.stderr
    assert "gst3d's planned chunks" in written.stdout


def test_cli_ingest_and_run_on_segy(volume_file, tmp_path):
    out = tmp_path / "v.zarr"
    args = ["--nworkers", "1", "--memory-limit", "1GB"]
    result = memchunk("ingest", volume_file, out, "--for", "gst3d", *args)
    assert result.returncode == 0, result.stderr
    assert "storage chunks inline:" in result.stdout and "tasks done" in result.stdout
    assert result.stderr == ""
    np.testing.assert_array_equal(xr.open_zarr(out).amplitude.values, segyio_cube(volume_file))
    again = memchunk("ingest", volume_file, out, *args)
    assert again.returncode == 2 and "exists" in again.stderr
    dip = memchunk("run", "gst3d", volume_file, tmp_path / "dip.zarr", *args)
    assert dip.returncode == 0, dip.stderr
    expected = open_segy(volume_file).load().memchunk.apply("gst3d")
    np.testing.assert_allclose(
        xr.open_zarr(tmp_path / "dip.zarr").dip.values, expected.values, rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        ("zeros", [], "cannot read"),
        ("holes", [], "missing traces"),
        ("volume", ["--for", "gst3d-typo"], "unknown operator"),
        ("volume", ["-o", "sigma=2"], "name it with --for"),
        ("zarr", [], "ingest reads SEG-Y"),
    ],
)
def test_cli_ingest_bad_input_exits_2_with_one_line(
    volume, volume_file, tmp_path, make, args, message
):
    source = {
        "zeros": tmp_path / "zeros.sgy",
        "holes": tmp_path / "holes.sgy",
        "volume": volume_file,
        "zarr": tmp_path / "v.zarr",
    }[make]
    if make == "zeros":
        source.write_bytes(bytes(5000))
    elif make == "holes":
        present = np.ones((30, 26), bool)
        present[0, 0] = False
        write_segy(volume, source, trace_present=present)
    elif make == "zarr":
        volume.to_dataset().to_zarr(source)
    result = memchunk("ingest", source, tmp_path / "out.zarr", *args)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.zarr").exists()


def test_headers_are_scanned_once_and_again_when_the_file_changes(volume, tmp_path):
    path = write_segy(volume, tmp_path / "v.sgy")
    first = segy.read_geometry(path)
    assert segy.read_geometry(path) is first  # opening, planning and writing share one scan
    assert not first.traces.flags.writeable  # shared, so read-only
    write_segy(volume, path, overwrite=True, first_inline=5001)  # the same size: other inlines
    assert segy.read_geometry(path).inlines[0] == 5001
    write_segy(volume.isel(inline=slice(0, 20)), path, overwrite=True)
    assert segy.read_geometry(path).shape == (20, 26, 40)
    assert open_segy(path).shape == (20, 26, 40)


def test_segyio_is_imported_by_one_thread_at_a_time(monkeypatch):
    """A worker's threads reading blocks at once import segyio one at a time (trial 268)."""
    import builtins
    import sys
    import threading
    import time

    from xarray_memchunk.seismic.segy import _segyio

    real_import, inside, most = builtins.__import__, [0], [0]

    def slow_import(name, *args, **kwargs):
        if name != "segyio":
            return real_import(name, *args, **kwargs)
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)  # the import's own time, in which another thread may come in
        try:
            return real_import(name, *args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(builtins, "__import__", slow_import)
    monkeypatch.delitem(sys.modules, "segyio")  # imported anew (the real one is put back)
    barrier = threading.Barrier(4)

    def read():
        barrier.wait()
        _segyio()

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1


@pytest.mark.parametrize("sorting", ["inline", "crossline"])
def test_each_task_carries_no_copy_of_a_regular_trace_grid(volume, tmp_path, sorting):
    # every task that reads the file carries its geometry, and a worker keeps each task's copy
    # until the computation ends (trial 668: 6.4 MB a task, 200 MiB on one worker)
    import pickle

    small = write_segy(volume, tmp_path / "small.sgy", sorting=sorting)
    large = write_segy(
        xr.concat([volume] * 8, "inline").assign_coords(inline=np.arange(240)),
        tmp_path / "large.sgy",
        sorting=sorting,
    )
    sizes = {}
    for path in (small, large):
        geometry = segy.read_geometry(path)
        payload = pickle.dumps(segy.SegyArray(geometry))
        copies = [pickle.loads(payload).geometry for _ in range(2)]
        # one grid per process, and the same as the scan's
        assert copies[0].traces is copies[1].traces
        np.testing.assert_array_equal(copies[0].traces, geometry.traces)
        assert copies[0].fast == geometry.fast
        sizes[path] = len(payload)
    # the grid grew 8x (a 6 KB grid to 50 KB); the payload by the inline numbers alone
    assert sizes[large] - sizes[small] < 8 * 240
    np.testing.assert_array_equal(
        pickle.loads(pickle.dumps(open_segy(large))).values, segyio_cube(large)
    )


def test_an_irregular_trace_grid_is_shared_by_the_copies_unpickled(volume, tmp_path):
    import pickle

    present = np.ones((30, 26), bool)
    present[:4, :3] = False
    geometry = segy.read_geometry(write_segy(volume, tmp_path / "holes.sgy", trace_present=present))
    payload = pickle.dumps(geometry)
    first, second = pickle.loads(payload), pickle.loads(payload)
    assert first.traces is second.traces
    assert not first.traces.flags.writeable
    np.testing.assert_array_equal(first.traces, geometry.traces)
    assert first.missing == 12


def test_write_segy_never_replaces_its_input_or_a_file_that_is_not_segy(volume, tmp_path):
    """A new user's ``write_segy(open_segy(p) * 2, p)`` deleted p before reading it (a 3.6 kB
    file, IndexError), and ``write_segy(..., "important.txt")`` replaced a text file."""
    from xarray_memchunk.errors import MemchunkError

    path = write_segy(volume, tmp_path / "v.sgy")
    before = path.read_bytes()
    for overwrite in (False, True):
        with pytest.raises(MemchunkError, match="is the input"):
            write_segy(open_segy(path) * 2, path, overwrite=overwrite)
    with pytest.raises(MemchunkError, match="exists; pass overwrite=True"):
        write_segy(volume, path)
    assert path.read_bytes() == before
    notes = tmp_path / "important.txt"
    notes.write_text("keep me")
    with pytest.raises(MemchunkError, match="is not a SEG-Y file"):
        write_segy(volume, notes, overwrite=True)
    assert notes.read_text() == "keep me"
    write_segy(volume * 2, path, overwrite=True)  # a SEG-Y file, replaced as asked
    np.testing.assert_allclose(open_segy(path).values, volume.values * 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["important.txt", "v.sgy"]


def test_an_interrupted_write_segy_leaves_the_file_that_was_there(volume, tmp_path):
    """Interrupted by SIGINT, a write over a 41.6 MB file left an 835,600-byte one that opened
    without error as 4 inlines of 200."""
    import dask.array as da

    path = write_segy(volume, tmp_path / "v.sgy")
    before = path.read_bytes()

    def fails_late(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:
            raise KeyboardInterrupt
        return block

    lazy = da.from_array(volume.values, chunks=(4, -1, -1)).map_blocks(fails_late, dtype="f4")
    with pytest.raises(KeyboardInterrupt):
        write_segy(lazy, path, overwrite=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["v.sgy"]


def test_write_segy_computes_each_chunk_of_a_lazy_volume_once(volume, tmp_path):
    """A 200^3 volume of one Dask chunk took 67.7 s to write, computed once per inline."""
    import dask.array as da

    calls = []

    def counted(block):
        calls.append(block.shape)
        return block

    lazy = da.from_array(volume.values, chunks=(10, -1, -1)).map_blocks(counted, dtype="f4")
    for sorting in ("inline", "crossline"):
        calls.clear()
        path = write_segy(lazy, tmp_path / f"{sorting}.sgy", sorting=sorting)
        np.testing.assert_array_equal(open_segy(path).values, volume.values)
        assert len(calls) == lazy.numblocks[0]  # not once per line: 30 or 26 times each

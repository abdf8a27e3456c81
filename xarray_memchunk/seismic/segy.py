"""SEG-Y in and out: a lazy (inline, crossline, sample) volume read with segyio, block by block.

:func:`open_segy` reads the file's geometry once (inline and crossline numbers from the trace
headers, sample times or depths, sample format, byte order, sorting) and returns a DataArray
backed by :class:`SegyArray`, an xarray backend array, exactly as ``xarray.open_dataset``
backs a Zarr or netCDF variable. So memchunk treats SEG-Y as a file input: ``apply`` reads each
planned block (halo included) straight from the file, and no task holds more than its block
and the traces it is reading. The storage unit is one trace: reads go by runs of consecutive
traces (an inline's crosslines in an inline-sorted file, a crossline's inlines in a
crossline-sorted one), whole, keeping the samples asked for.

Sample formats: whatever segyio reads (4-byte IBM and IEEE floats, 1-, 2- and 4-byte integers,
8-byte IEEE floats), in the file's byte order (``endian="auto"`` tries big, then little).

Geometry: a file whose traces fill the inline x crossline grid opens as is. One with missing
traces (an irregular survey outline, a gap) raises :class:`~xarray_memchunk.MemchunkError`
saying how many are missing, unless ``fill`` is given: then missing traces read as ``fill``
(the amplitudes become float32 when ``fill`` is NaN and the samples are integers) and the
DataArray gets a ``trace_present`` (inline, crossline) coordinate. Two traces at one grid
position are an error either way.

:func:`write_volume` writes a volume as a post-stack SEG-Y rev 1 file, a few inlines at a time (test
data, the tutorials' input), with the headers other readers require: a textual header that
names the byte positions, the revision, fixed trace length, the measurement system (metres), and
per trace the inline and crossline numbers, CDP X and Y on a regular grid with a coordinate
scalar (MDIO refuses a scalar of 0 in a rev 0 or rev 1 file), its ensemble number and its
sequence numbers. Users call :func:`xarray_memchunk.io.open_segy` and
:func:`xarray_memchunk.io.write_segy`, which writes through :func:`write_volume` under a hidden
name and moves the file into place once complete.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends.common import BackendArray
from xarray.core import indexing

from ..errors import MemchunkError

__all__ = [
    "SEGY_SUFFIXES",
    "SegyArray",
    "SegyGeometry",
    "open_segy",
    "read_geometry",
    "is_segy",
    "write_volume",
]

SEGY_SUFFIXES = {".sgy", ".segy", ".seg-y"}
DIMS = ("inline", "crossline", "sample")
#: numpy dtype of the samples of each SEG-Y sample format :func:`write_segy` writes.
FORMAT_DTYPES = {1: "float32", 2: "int32", 3: "int16", 5: "float32", 6: "float64", 8: "int8"}
#: Trace-header byte positions of the inline and crossline numbers (SEG-Y rev 1).
INLINE_BYTE, CROSSLINE_BYTE = 189, 193
#: Trace-header byte positions of CDP X and Y, and of the scalar applied to coordinates.
CDP_X_BYTE, CDP_Y_BYTE, COORDINATE_SCALAR_BYTE = 181, 185, 71
#: Coordinate scalars SEG-Y allows (a negative one divides, a positive one multiplies).
COORDINATE_SCALARS = (1, 10, 100, 1000, 10000, -10, -100, -1000, -10000)
#: Bytes of a SEG-Y file's textual and binary headers, and of one trace header.
FILE_HEADER_BYTES, TRACE_HEADER_BYTES = 3600, 240
#: Files whose scanned geometry is kept (its trace grid: 8 bytes per inline x crossline).
GEOMETRY_CACHE_SIZE = 2


@dataclass(frozen=True)
class SegyGeometry:
    """Where each (inline, crossline) trace is in a SEG-Y file, and what its samples are.

    Attributes
    ----------
    path
        The file.
    endian
        ``"big"`` or ``"little"``.
    iline, xline
        Trace-header bytes of the inline and crossline numbers.
    inlines, crosslines
        The grid's inline and crossline numbers, ascending.
    samples
        Sample times (ms) or depths, from the binary and trace headers.
    dtype
        The samples' dtype as segyio reads them.
    sample_format
        segyio's name of the sample format.
    traces
        Trace index per (inline, crossline), -1 where the file has none.
    fast
        ``"crossline"`` when consecutive traces walk along crosslines (inline-sorted),
        ``"inline"`` when they walk along inlines.
    """

    path: str
    endian: str
    iline: int
    xline: int
    inlines: np.ndarray
    crosslines: np.ndarray
    samples: np.ndarray
    dtype: np.dtype
    sample_format: str
    traces: np.ndarray
    fast: str

    @property
    def shape(self) -> tuple[int, int, int]:
        """(inlines, crosslines, samples)."""
        return (len(self.inlines), len(self.crosslines), len(self.samples))

    @property
    def missing(self) -> int:
        """Grid positions with no trace."""
        return int((self.traces < 0).sum())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle without the trace grid where it is the sorted file's own, else interned.

        Every task that reads a SEG-Y file carries its geometry (the read is inlined into the
        task that uses the block), and a worker keeps each task's copy until the computation
        ends: an 884 x 911 grid is 6.4 MB a task (trial 668: 33 tasks held 200 MiB more than
        their peaks on a 1-thread worker). A regular grid (every trace, in the file's sorted
        order) is rebuilt from its shape, once per process; another is shared by every copy
        unpickled in one process (:func:`_interned_traces`).
        """
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "traces"}
        return _unpickled_geometry, (state, *self._pickled_traces)

    @functools.cached_property
    def _pickled_traces(self) -> tuple[np.ndarray | None, str]:
        """The grid as pickled, and its digest: ``(None, "")`` where it is the sorted file's own.

        Found once per geometry: a scheduler pickles one geometry into every task it sends.
        """
        if np.array_equal(self.traces, _regular_traces(*self.traces.shape, self.fast)):
            return None, ""
        return self.traces, hashlib.blake2b(self.traces.tobytes()).hexdigest()


def _unpickled_geometry(state: dict[str, Any], traces: np.ndarray | None, digest: str):
    """A :class:`SegyGeometry` from its pickled form (:meth:`SegyGeometry.__reduce__`)."""
    n_il, n_xl = len(state["inlines"]), len(state["crosslines"])
    if traces is None:
        shared = _regular_traces(n_il, n_xl, state["fast"])
    else:
        shared = _interned_traces(traces, digest)
    return SegyGeometry(**state, traces=shared)


@functools.lru_cache(maxsize=GEOMETRY_CACHE_SIZE)
def _regular_traces(n_il: int, n_xl: int, fast: str) -> np.ndarray:
    """The trace grid of a file with every trace, sorted along ``fast`` (read-only, shared)."""
    numbers = np.arange(n_il * n_xl, dtype=np.int64)
    traces = numbers.reshape(n_il, n_xl) if fast == "crossline" else numbers.reshape(n_xl, n_il).T
    traces.flags.writeable = False
    return traces


#: Trace grids unpickled in this process, by content: one copy, however many tasks carry it.
_TRACES: weakref.WeakValueDictionary[str, np.ndarray] = weakref.WeakValueDictionary()
_TRACES_LOCK = threading.Lock()


def _interned_traces(traces: np.ndarray, digest: str) -> np.ndarray:
    """The copy of ``traces`` this process holds already, else ``traces`` (read-only) kept."""
    with _TRACES_LOCK:
        kept = _TRACES.get(digest)
        if kept is not None and kept.shape == traces.shape:
            return kept
        traces.flags.writeable = False
        _TRACES[digest] = traces
        return traces


#: One thread at a time imports segyio. In trial 268 (a worker with 2 threads reading blocks of a
#: SEG-Y file), one thread's read failed with "cannot access submodule '_segyio' of module
#: 'segyio' (most likely due to a circular import)": it saw the package half-initialised.
_IMPORT_LOCK = threading.Lock()


def _segyio() -> Any:
    """The segyio module, or an error that says how to install it."""
    try:
        with _IMPORT_LOCK:
            import segyio
    except ImportError as exc:
        raise MemchunkError(
            "reading and writing SEG-Y needs segyio: pip install 'xarray-memchunk[seismic]'"
        ) from exc
    return segyio


def _open(path: str, endian: str, iline: int, xline: int):
    return _segyio().open(path, "r", iline=iline, xline=xline, ignore_geometry=True, endian=endian)


def _fail(path: str, reason: str) -> MemchunkError:
    return MemchunkError(f"cannot read {path!r} as SEG-Y: {reason}")


def read_geometry(
    path: str | os.PathLike,
    *,
    iline: int = INLINE_BYTE,
    xline: int = CROSSLINE_BYTE,
    endian: str = "auto",
) -> SegyGeometry:
    """Read a SEG-Y file's headers: its grid, samples, format and byte order.

    segyio's warnings about a byte order that turns out wrong are dropped; those of the one
    that reads the file are passed on, on the first scan: the geometry of an unchanged file is
    kept (:data:`GEOMETRY_CACHE_SIZE` files) and returned again without a scan.

    Raises
    ------
    MemchunkError
        When the file is missing, is not SEG-Y (in either byte order), has no traces, or has
        two traces at one (inline, crossline).
    """
    _segyio()
    path = str(path)
    if not Path(path).is_file():
        raise MemchunkError(f"input {path!r} does not exist")
    stat = Path(path).stat()
    identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return _scanned_geometry(path, identity, iline, xline, endian)


@functools.lru_cache(maxsize=GEOMETRY_CACHE_SIZE)
def _scanned_geometry(
    path: str, identity: tuple[int, ...], iline: int, xline: int, endian: str
) -> SegyGeometry:
    """The geometry of ``path`` as it is now (inode, size, modification and change times).

    Opening a file, planning for it and writing it each need its geometry, and each scan reads
    every trace header; a file changed since (any of those four differs) is scanned again. The
    geometry's arrays are read-only, as it is shared. Cache hits repeat no segyio warning.
    """
    size = identity[1]
    if size <= FILE_HEADER_BYTES + TRACE_HEADER_BYTES:
        raise _fail(
            path,
            f"it has no traces ({size} bytes: the file headers take {FILE_HEADER_BYTES}, and "
            f"each trace {TRACE_HEADER_BYTES} more plus its samples)",
        )
    from segyio import BinField, TraceField

    orders = ("big", "little") if endian == "auto" else (endian,)
    errors = []
    for order in orders:
        try:
            with (
                warnings.catch_warnings(record=True) as caught,
                _open(path, order, iline, xline) as f,
            ):
                if f.tracecount == 0 or len(f.samples) == 0:
                    raise RuntimeError("no traces")
                if str(f.format).startswith("Unknown") or f.dtype is None:
                    raise RuntimeError(f"unknown sample format {f.format}")
                inl = np.asarray(f.attributes(iline)[:], dtype=np.int64)
                xl = np.asarray(f.attributes(xline)[:], dtype=np.int64)
                samples = np.asarray(f.samples, dtype=np.float64)
                dtype, sample_format = np.dtype(f.dtype), str(f.format)
                no_interval = (
                    not f.bin[BinField.Interval]
                    and not f.header[0][TraceField.TRACE_SAMPLE_INTERVAL]
                )
        except (RuntimeError, ValueError, OSError, IndexError, KeyError) as exc:
            errors.append(f"{order}-endian: {exc}")
            continue
        for warning in caught:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        if no_interval:
            warnings.warn(
                f"{path}: the file states no sample interval (0 in its binary header and its "
                f"first trace's): its samples are numbered in segyio's default steps of "
                f"{samples[1] - samples[0] if len(samples) > 1 else 4.0:g} ms; relabel them "
                f"(.assign_coords(sample=...)) with the survey's interval",
                UserWarning,
                stacklevel=4,
            )
        return _grid(path, order, iline, xline, inl, xl, samples, dtype, sample_format)
    raise _fail(path, "; ".join(errors))


def _grid(path, endian, iline, xline, inl, xl, samples, dtype, sample_format) -> SegyGeometry:
    inlines, il_index = np.unique(inl, return_inverse=True)
    crosslines, xl_index = np.unique(xl, return_inverse=True)
    traces = np.full((len(inlines), len(crosslines)), -1, dtype=np.int64)
    position = il_index * len(crosslines) + xl_index
    if len(np.unique(position)) != len(position):
        raise _fail(
            path,
            f"several traces share an (inline, crossline) position (header bytes {iline}, "
            f"{xline}); give the bytes that hold them with iline= and xline=",
        )
    traces.reshape(-1)[position] = np.arange(len(position))
    fast = "inline" if len(xl) > 1 and xl[0] == xl[1] else "crossline"
    for shared in (inlines, crosslines, samples, traces):
        shared.flags.writeable = False
    return SegyGeometry(
        path, endian, iline, xline, inlines, crosslines, samples, dtype, sample_format, traces, fast
    )


class SegyArray(BackendArray):
    """A (inline, crossline, sample) SEG-Y volume, read block by block with segyio.

    Each read opens the file (headers are not scanned again) and reads runs of consecutive
    traces; positions with no trace read as ``fill``.
    """

    def __init__(self, geometry: SegyGeometry, fill: float | None = None) -> None:
        self.geometry = geometry
        self.fill = fill
        self.shape = geometry.shape
        self.dtype = _filled_dtype(geometry.dtype, fill)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.BASIC, self._read
        )

    def _read(self, key: tuple) -> np.ndarray:
        ranges = []
        for k, n in zip(key, self.shape, strict=True):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise ValueError("SEG-Y blocks are read with unit steps")
                ranges.append((start, stop))
            else:
                ranges.append((int(k), int(k) + 1))
        (i0, i1), (x0, x1), (s0, s1) = ranges
        fill = 0 if self.fill is None else self.fill
        out = np.full((i1 - i0, x1 - x0, s1 - s0), fill, dtype=self.dtype)
        g = self.geometry
        traces = g.traces[i0:i1, x0:x1]
        walk = traces if g.fast == "crossline" else traces.T
        with _open(g.path, g.endian, g.iline, g.xline) as f:
            for outer, row in enumerate(walk):
                for first, last in _runs(row):
                    data = f.trace.raw[int(row[first]) : int(row[last - 1]) + 1]
                    if g.fast == "crossline":
                        out[outer, first:last] = data[:, s0:s1]
                    else:
                        out[first:last, outer] = data[:, s0:s1]
        squeeze = tuple(i for i, k in enumerate(key) if not isinstance(k, slice))
        return out.squeeze(axis=squeeze) if squeeze else out


def _filled_dtype(dtype: np.dtype, fill: float | None) -> np.dtype:
    """The samples' dtype, or float32 when integer samples must hold a NaN ``fill``."""
    if fill is None or dtype.kind == "f":
        return dtype
    if np.isnan(fill):
        return np.dtype("float32")
    if not float(fill).is_integer() or not np.iinfo(dtype).min <= fill <= np.iinfo(dtype).max:
        raise MemchunkError(
            f"fill={fill!r} is not a value of the file's {dtype} samples: give an integer in "
            f"their range, or numpy.nan to read the volume as float32"
        )
    return dtype


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """[first, last) positions of runs of consecutive trace numbers in ``row`` (-1: no trace)."""
    runs, start = [], None
    for j, t in enumerate(row):
        if t < 0:
            if start is not None:
                runs.append((start, j))
                start = None
        elif start is None or t != row[j - 1] + 1:
            if start is not None:
                runs.append((start, j))
            start = j
    if start is not None:
        runs.append((start, len(row)))
    return runs


def open_segy(
    path: str | os.PathLike,
    *,
    chunks: Any = None,
    iline: int = INLINE_BYTE,
    xline: int = CROSSLINE_BYTE,
    endian: str = "auto",
    fill: float | None = None,
    domain: str = "time",
) -> xr.DataArray:
    """Open a SEG-Y file as a lazy, Dask-backed ``amplitude(inline, crossline, sample)``.

    Parameters
    ----------
    path
        The SEG-Y file.
    chunks
        As ``xarray.open_dataset`` takes them. None reads by inline in an inline-sorted file
        (by crossline in a crossline-sorted one): the traces a read gets in one piece. memchunk
        plans its own chunks on top, and reads them straight from the file.
    iline, xline
        Trace-header bytes of the inline and crossline numbers (189 and 193 in SEG-Y rev 1).
    endian
        ``"big"`` (the standard), ``"little"``, or ``"auto"`` to try both.
    fill
        The value of missing traces (e.g. ``numpy.nan``); None refuses files with missing
        traces.
    domain
        ``"time"`` (samples in ms of two-way time) or ``"depth"`` (in the file's unit).

    Returns
    -------
    xarray.DataArray
        ``amplitude`` with CF-style coordinates (``inline`` axis X, ``crossline`` axis Y,
        ``sample`` axis Z), the file's facts in ``attrs``, and a ``trace_present``
        (inline, crossline) coordinate where traces are missing.

    Raises
    ------
    MemchunkError
        The file is missing or is not SEG-Y, has missing traces and no ``fill``, ``fill`` does
        not fit integer samples, or ``domain`` is neither time nor depth.
    """
    if domain not in ("time", "depth"):
        raise MemchunkError(f"domain must be 'time' or 'depth', got {domain!r}")
    geometry = read_geometry(path, iline=iline, xline=xline, endian=endian)
    if geometry.missing and fill is None:
        raise MemchunkError(
            f"{str(path)!r} has {geometry.missing} missing traces in its "
            f"{geometry.shape[0]} x {geometry.shape[1]} inline x crossline grid: pass fill= "
            f"(e.g. numpy.nan; on the command line: --fill nan) to read them as that value, with a "
            f"trace_present mask"
        )
    array = SegyArray(geometry, fill)
    sample_attrs = {"axis": "Z", "positive": "down"} | (
        # no standard_name: CF's "time" is calendar time, and would make sample the T axis
        {"units": "ms", "long_name": "two-way time"}
        if domain == "time"
        else {"long_name": "depth", "standard_name": "depth"}
    )
    coords: dict[str, Any] = {
        "inline": ("inline", geometry.inlines.copy(), {"axis": "X", "long_name": "inline number"}),
        "crossline": (
            "crossline",
            geometry.crosslines.copy(),
            {"axis": "Y", "long_name": "crossline number"},
        ),
        "sample": ("sample", geometry.samples.copy(), sample_attrs),
    }
    if geometry.missing:
        coords["trace_present"] = (("inline", "crossline"), geometry.traces >= 0)
    variable = xr.Variable(
        DIMS,
        indexing.LazilyIndexedArray(array),
        attrs={
            "long_name": "seismic amplitude",
            "source": str(path),
            "segy_sample_format": geometry.sample_format,
            "segy_endian": geometry.endian,
            "segy_sorting": f"{'inline' if geometry.fast == 'crossline' else 'crossline'}-sorted",
        },
    )
    # the file's unit is a trace: any run of whole traces is one read
    variable.encoding["preferred_chunks"] = dict(zip(DIMS, (1, 1, geometry.shape[2]), strict=True))
    da = xr.DataArray(variable, coords=coords, name="amplitude")
    unit = dict(zip(DIMS, _read_unit(geometry), strict=True))
    return da.chunk(unit if chunks is None else chunks)


def is_segy(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file whose binary header reads as SEG-Y's.

    A sample count above 0 and a sample format code SEG-Y defines, in either byte order.
    """
    try:
        with open(path, "rb") as f:
            f.seek(3220)
            header = f.read(6)
    except OSError:
        return False
    if len(header) < 6:
        return False
    for order in ("big", "little"):
        samples = int.from_bytes(header[0:2], order)
        code = int.from_bytes(header[4:6], order)
        if samples > 0 and code in {1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 15, 16}:
            return True
    return False


def _read_unit(geometry: SegyGeometry) -> tuple[int, int, int]:
    """One inline (crossline-sorted file: one crossline) of whole traces, read in one run."""
    n_il, n_xl, n_s = geometry.shape
    return (1, n_xl, n_s) if geometry.fast == "crossline" else (n_il, 1, n_s)


def write_volume(
    volume: Any,
    path: str | os.PathLike,
    *,
    sample_format: int = 5,
    endian: str = "big",
    sorting: str = "inline",
    sample_interval_ms: float = 4.0,
    first_inline: int = 1,
    first_crossline: int = 1,
    trace_present: np.ndarray | None = None,
    origin: tuple[float, float] = (0.0, 0.0),
    bin_size: tuple[float, float] = (25.0, 25.0),
    coordinate_scalar: int = -100,
) -> Path:
    """Write a 3-D (inline, crossline, sample) volume as a post-stack SEG-Y rev 1 file.

    :func:`xarray_memchunk.io.write_segy` calls it with a hidden name beside its target, which
    it moves into place once written. The volume is computed a few inlines (or crosslines) at
    a time (:func:`_outer_slabs`): a row of its chunks along that axis, or fewer lines where a
    row is over :data:`SLAB_BYTES`, so a lazy volume (a Dask-backed DataArray) never needs to
    fit in memory, and each chunk is computed once where its row fits (an inline at a time,
    the 200^3 volume of one chunk took 67.7 s to write, computed 200 times, against 1.07 s
    for its values). The headers are those other readers (segyio, MDIO) require: see the
    module docstring.

    Parameters
    ----------
    volume
        Anything indexable like a 3-D array: numpy, Dask, an xarray DataArray.
    path
        The file to write (replaced if it exists).
    sample_format
        SEG-Y sample format code: 1 (IBM float), 2 (int32), 3 (int16), 5 (IEEE float32),
        6 (IEEE float64) or 8 (int8). Amplitudes are cast to it (rounded for integers).
    endian
        ``"big"`` (the standard) or ``"little"``.
    sorting
        ``"inline"`` (consecutive traces walk along crosslines) or ``"crossline"``.
    sample_interval_ms
        Sample interval written to the headers.
    first_inline, first_crossline
        Numbers of the first inline and crossline (they go up by one).
    trace_present
        (inline, crossline) booleans; positions that are False get no trace, as in a survey
        with an irregular outline. All present when None.
    origin
        CDP X and Y (metres) of the first inline's first crossline.
    bin_size
        Metres between crosslines (along X) and between inlines (along Y): CDP X is
        ``origin[0] + crossline index x bin_size[0]``, CDP Y ``origin[1] + inline index x
        bin_size[1]``.
    coordinate_scalar
        SEG-Y's scalar for the coordinates (bytes 71-72): -100 stores them in centimetres.

    Returns
    -------
    pathlib.Path
        The file written.
    """
    segyio = _segyio()
    if sample_format not in FORMAT_DTYPES:
        raise MemchunkError(
            f"sample_format must be one of {sorted(FORMAT_DTYPES)} (SEG-Y format codes), "
            f"got {sample_format!r}"
        )
    if sorting not in ("inline", "crossline"):
        raise MemchunkError(f"sorting must be 'inline' or 'crossline', got {sorting!r}")
    if coordinate_scalar not in COORDINATE_SCALARS:
        raise MemchunkError(
            f"coordinate_scalar must be one of {COORDINATE_SCALARS} (SEG-Y rev 1), got "
            f"{coordinate_scalar!r}"
        )
    n_il, n_xl, n_s = (int(n) for n in volume.shape)
    present = np.ones((n_il, n_xl), bool) if trace_present is None else np.asarray(trace_present)
    if present.shape != (n_il, n_xl):
        raise MemchunkError(
            f"trace_present has shape {present.shape}, the volume's grid is {(n_il, n_xl)}"
        )
    dtype = np.dtype(FORMAT_DTYPES[sample_format])
    spec = segyio.spec()
    spec.iline, spec.xline = INLINE_BYTE, CROSSLINE_BYTE
    spec.samples = np.arange(n_s) * sample_interval_ms
    spec.format = sample_format
    spec.endian = endian
    spec.tracecount = int(present.sum())
    interval_us = round(sample_interval_ms * 1000)
    stored = _stored_coordinates(origin, bin_size, coordinate_scalar, n_il, n_xl)
    axis = 0 if sorting == "inline" else 1
    path = Path(path)
    path.unlink(missing_ok=True)
    field = segyio.TraceField
    with segyio.create(str(path), spec) as f:
        f.text[0] = _textual_header(segyio, (n_il, n_xl, n_s), sample_interval_ms, sorting)
        f.bin.update(_binary_header(segyio, interval_us, n_s, sample_format))
        trace = 0
        for o, block in _outer_slabs(volume, axis, dtype, sample_format):
            for inner in range(block.shape[0]):
                il, xl = (o, inner) if sorting == "inline" else (inner, o)
                if not present[il, xl]:
                    continue
                x, y = stored[0][xl], stored[1][il]
                f.header[trace] = {
                    field.TRACE_SEQUENCE_LINE: trace + 1,
                    field.TRACE_SEQUENCE_FILE: trace + 1,
                    field.CDP: il * n_xl + xl + 1,
                    field.TraceNumber: 1,
                    field.TraceIdentificationCode: 1,
                    field.ElevationScalar: 1,
                    field.SourceGroupScalar: coordinate_scalar,
                    field.SourceX: x,
                    field.SourceY: y,
                    field.GroupX: x,
                    field.GroupY: y,
                    field.CoordinateUnits: 1,
                    field.CDP_X: x,
                    field.CDP_Y: y,
                    field.INLINE_3D: first_inline + il,
                    field.CROSSLINE_3D: first_crossline + xl,
                    field.TRACE_SAMPLE_COUNT: n_s,
                    field.TRACE_SAMPLE_INTERVAL: interval_us,
                }
                f.trace[trace] = block[inner]
                trace += 1
    return path


def _stored_coordinates(
    origin: tuple[float, float],
    bin_size: tuple[float, float],
    scalar: int,
    n_il: int,
    n_xl: int,
) -> tuple[list[int], list[int]]:
    """CDP X per crossline and CDP Y per inline, as the integers the headers store."""
    factor = -scalar if scalar < 0 else 1 / scalar  # stored x scalar (or / -scalar) = metres
    x = np.rint((origin[0] + np.arange(n_xl) * bin_size[0]) * factor).astype(np.int64)
    y = np.rint((origin[1] + np.arange(n_il) * bin_size[1]) * factor).astype(np.int64)
    if max(np.abs(x).max(initial=0), np.abs(y).max(initial=0)) >= 2**31:
        raise MemchunkError(
            f"coordinates up to {x.max() / factor:.0f}, {y.max() / factor:.0f} m do not fit "
            f"SEG-Y's 4-byte integers with coordinate_scalar={scalar}: use a smaller one"
        )
    return [int(v) for v in x], [int(v) for v in y]


def _textual_header(
    segyio: Any, shape: tuple[int, int, int], interval: float, sorting: str
) -> bytes:
    """The 3200-byte textual header: what the file is, and where its headers keep what."""
    n_il, n_xl, n_s = shape
    return segyio.tools.create_text_header(
        {
            1: "WRITTEN BY XARRAY-MEMCHUNK WRITE_SEGY",
            2: f"POST-STACK 3-D VOLUME {n_il} INLINES X {n_xl} CROSSLINES X {n_s} SAMPLES",
            3: f"SAMPLE INTERVAL {interval} MS, {sorting.upper()}-SORTED",
            4: f"INLINE BYTES {INLINE_BYTE}-{INLINE_BYTE + 3} CROSSLINE BYTES "
            f"{CROSSLINE_BYTE}-{CROSSLINE_BYTE + 3}",
            5: f"CDP X BYTES {CDP_X_BYTE}-{CDP_X_BYTE + 3} CDP Y BYTES {CDP_Y_BYTE}-"
            f"{CDP_Y_BYTE + 3} COORDINATE SCALAR BYTES {COORDINATE_SCALAR_BYTE}-"
            f"{COORDINATE_SCALAR_BYTE + 1}",
            6: "COORDINATES IN METRES",
            39: "SEG-Y REV1",
            40: "END TEXTUAL HEADER",
        }
    )


def _binary_header(segyio: Any, interval_us: int, n_s: int, sample_format: int) -> dict:
    field = segyio.BinField
    return {
        field.Interval: interval_us,
        field.Samples: n_s,
        field.Format: sample_format,
        field.SortingCode: 4,  # horizontally stacked
        field.EnsembleFold: 1,
        field.MeasurementSystem: 1,  # metres
        field.SEGYRevision: 1,  # rev 1.0
        field.SEGYRevisionMinor: 0,
        field.TraceFlag: 1,  # every trace has the same length
        field.ExtendedHeaders: 0,
    }


#: Most bytes of the volume :func:`write_volume` computes at once: a row of its chunks along the
#: outer axis where that fits, else as many whole lines as fit (at least one).
SLAB_BYTES = 64 * 2**20


def _outer_slabs(
    volume: Any, axis: int, dtype: np.dtype, sample_format: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Each line along ``axis`` (0: inlines, 1: crosslines), as (its index, its samples).

    Computed a slab of lines at a time: a row of the volume's chunks along ``axis`` (each
    chunk computed once), or fewer lines where the row is over :data:`SLAB_BYTES`.
    """
    n = int(volume.shape[axis])
    line_bytes = np.dtype(volume.dtype).itemsize * math.prod(volume.shape) // max(n, 1)
    most = max(1, SLAB_BYTES // max(line_bytes, 1))
    chunks = getattr(volume, "chunks", None)
    if chunks and isinstance(chunks[axis], tuple):  # Dask (or a DataArray of it)
        rows = chunks[axis]
    else:
        rows = (n,)
    start = 0
    for row in rows:
        for first in range(start, start + row, most):
            last = min(first + most, start + row)
            index = (slice(first, last),) if axis == 0 else (slice(None), slice(first, last))
            slab = _in_file_dtype(np.asarray(volume[index]), dtype, sample_format)
            for offset in range(last - first):
                yield first + offset, slab[offset] if axis == 0 else slab[:, offset]
        start += row


def _in_file_dtype(block: np.ndarray, dtype: np.dtype, sample_format: int) -> np.ndarray:
    """``block`` in the file's sample dtype (rounded, and checked, for integers)."""
    if dtype.kind in "iu":
        block = np.rint(block)
        info = np.iinfo(dtype)
        if block.size and (block.min() < info.min or block.max() > info.max):
            raise MemchunkError(
                f"amplitudes from {block.min()} to {block.max()} do not fit format "
                f"{sample_format} ({dtype}): scale them first, or use a float format"
            )
    return block.astype(dtype)

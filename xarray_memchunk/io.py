"""Open Zarr / netCDF / SEG-Y inputs with their storage chunks, and write results safely.

SEG-Y in and out: :func:`open_segy` (lazy, block by block, from
:mod:`xarray_memchunk.seismic.segy`) and :func:`write_segy` (a volume as a post-stack rev 1 file
with standard headers, written as results are: below).

Safe writes: the result is written next to the target under a hidden name that says what it
is, and moved into place only once complete. With one id per write:

1. ``.{name}.memchunk-partial-{id}``: being written;
2. renamed ``.{name}.memchunk-complete-{id}`` once written;
3. with ``overwrite=True``, the existing target is renamed ``.{name}.memchunk-old-{id}``;
4. the complete result is renamed to the target;
5. the old target is removed.

An existing target is never touched without ``overwrite=True``, and ``overwrite=True`` replaces
only a dataset (a Zarr store, a netCDF or HDF5 file; :func:`write_segy`: a SEG-Y file), never
another file or directory. A target
that is an input of the write, holds one, or lies inside one is refused (paths compared with
symlinks resolved). If the run fails (a killed worker, Ctrl-C, SIGTERM, a full disk) the partial
write is removed and the target is untouched.
A hard kill (SIGKILL, a power cut) can stop the sequence anywhere; the next write to the same
target (:func:`recover`) reads the names left behind, finishes or undoes what was under way,
and reports it: a partial write is removed; a complete one whose target is missing is moved into
place (the kill came between steps 3 and 4); an old target whose replacement is in place is
removed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import xarray as xr

from .clusters import active_client
from .errors import MemchunkError
from .memory_limits import threaded_scheduler_threads
from .operators.sources import source_files
from .seismic.segy import SEGY_SUFFIXES, is_segy, open_segy, write_volume

__all__ = [
    "RecoveredWriteWarning",
    "check_target",
    "compute_in_own_pool",
    "input_paths",
    "is_dataset",
    "open_input",
    "open_segy",
    "output_format",
    "overwrite_by_mode",
    "refuse_delayed_write",
    "recover",
    "safe_write",
    "write_segy",
]


#: Seconds a failed write waits for its tasks still running on a cluster before it removes
#: what they wrote (:func:`_wait_for_running`).
WRITE_SETTLE_SECONDS = 120.0


class RecoveredWriteWarning(UserWarning):
    """What :func:`recover` found and did with the leftovers of an interrupted write."""


_NETCDF_SUFFIXES = {".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5"}
#: Metadata files, one of which is at the top of every Zarr store (v2 group or array, v3).
_ZARR_METADATA = (".zgroup", ".zarray", "zarr.json")
#: First bytes of netCDF classic, 64-bit offset and CDF-5 files, and of HDF5 (netCDF4) files.
_DATASET_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF")


def output_format(path: str | os.PathLike) -> str:
    """``"netcdf"`` for ``.nc``-like names, ``"zarr"`` otherwise."""
    return "netcdf" if Path(path).suffix.lower() in _NETCDF_SUFFIXES else "zarr"


def open_input(
    path: str | os.PathLike, variable: str | None = None, *, fill: float | None = None
) -> xr.Dataset | xr.DataArray:
    """Open a Zarr store, netCDF or SEG-Y file lazily, keeping its storage chunks.

    SEG-Y files (by suffix: ``.sgy``, ``.segy``) open with :func:`open_segy`'s defaults as the
    DataArray ``amplitude``; ``fill``: the value of their missing traces (``open_segy``'s). A
    pattern (``'data/tas_*.nc'``: ``*``, ``?`` or ``[``) opens the netCDF files it matches as
    one dataset, as ``xarray.open_mfdataset`` combines them by their coordinates.

    Raises
    ------
    MemchunkError
        When the path does not exist (a pattern matches nothing), is not a dataset, or lacks
        ``variable``; or ``fill`` is given for an input that is not SEG-Y.
    """
    if _is_pattern(path):
        return _open_files(str(path), variable, fill)
    path = Path(path)
    if not path.exists():
        raise MemchunkError(f"input {str(path)!r} does not exist")
    if path.suffix.lower() in SEGY_SUFFIXES:
        if variable not in (None, "amplitude"):
            raise MemchunkError(f"a SEG-Y file has one variable, 'amplitude', not {variable!r}")
        return open_segy(path, fill=fill)
    if fill is not None:
        raise MemchunkError(
            f"--fill (fill=) is the value of a SEG-Y file's missing traces; {str(path)!r} is "
            f"not a SEG-Y file (.sgy, .segy)"
        )
    try:
        if path.is_dir():
            ds = xr.open_zarr(path, chunks={})
        else:
            ds = xr.open_dataset(path, chunks={})
    except Exception as exc:  # every backend has its own error types
        raise MemchunkError(
            f"cannot open {str(path)!r} as a Zarr store or netCDF file: {_first_line(exc)}"
        ) from exc
    return _variable(ds, variable, repr(str(path)))


def _is_pattern(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a pattern of files: a file named "run[1].nc" is no pattern."""
    return glob.has_magic(str(path)) and not Path(path).exists()


def input_paths(path: str | os.PathLike) -> list[str]:
    """The paths an input names (:func:`open_input`): the files a pattern matches, or itself."""
    return sorted(glob.glob(str(path))) if _is_pattern(path) else [str(path)]


def _open_files(
    pattern: str, variable: str | None, fill: float | None
) -> xr.Dataset | xr.DataArray:
    """The netCDF files ``pattern`` matches, opened as one dataset (:func:`open_input`)."""
    files = input_paths(pattern)
    if not files:
        raise MemchunkError(f"input pattern {pattern!r} matches no file")
    if len(files) == 1:  # opened as named: a "[" in its name is no pattern there
        return open_input(Path(files[0]), variable, fill=fill)
    unfit = [f for f in files if Path(f).is_dir() or Path(f).suffix.lower() in SEGY_SUFFIXES]
    if unfit:
        raise MemchunkError(
            f"input pattern {pattern!r} matches {len(files)} paths, which are opened as netCDF "
            f"files together; {unfit[0]!r} is not one: name one Zarr store or SEG-Y file"
        )
    if fill is not None:
        raise MemchunkError("--fill (fill=) is the value of a SEG-Y file's missing traces")
    try:
        ds = xr.open_mfdataset(
            files, chunks={}, data_vars="minimal", coords="minimal", compat="override"
        )
    except Exception as exc:  # every backend, and combining, has its own error types
        raise MemchunkError(
            f"cannot open the {len(files)} files {pattern!r} matches as one dataset: "
            f"{_first_line(exc)}"
        ) from exc
    return _variable(ds, variable, f"the files {pattern!r} matches")


def _first_line(exc: Exception) -> str:
    """``exc``'s type and the first line of its message."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _variable(ds: xr.Dataset, variable: str | None, where: str) -> xr.Dataset | xr.DataArray:
    """``ds``, or its ``variable``; refused where it has none of that name (``where``)."""
    if variable is None:
        return ds
    if variable not in ds.data_vars:
        raise MemchunkError(
            f"no variable {variable!r} in {where}; variables: {', '.join(map(str, ds.data_vars))}"
        )
    return ds[variable]


def _piece(target: Path, stage: str, write_id: str) -> Path:
    """The hidden name of one piece of a write (``partial``, ``complete`` or ``old``)."""
    return target.with_name(f".{target.name}.memchunk-{stage}-{write_id}")


def _remove(path: Path) -> None:
    """Remove a file or directory tree; a symlink itself, never what it points to."""
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def recover(target: str | os.PathLike) -> list[str]:
    """Finish or undo what interrupted writes to ``target`` left, and say what was done.

    See the module docstring for the names and the rules. Returns one sentence per action.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.memchunk-(partial|complete|old)-(\w+)$")
    found: dict[str, dict[str, Path]] = {}
    for path in target.parent.iterdir():
        match = pattern.match(path.name)
        if match:
            found.setdefault(match.group(2), {})[match.group(1)] = path
    done = []
    for _, pieces in sorted(found.items()):
        if "partial" in pieces:
            _remove(pieces["partial"])
            done.append(f"removed {pieces['partial'].name}, a write interrupted before it ended")
        complete, old = pieces.get("complete"), pieces.get("old")
        if complete is not None and not target.exists():
            os.replace(complete, target)
            done.append(
                f"moved {complete.name} to {target.name}: an interrupted run had written it "
                f"completely and was replacing {target.name}"
            )
        elif complete is not None:
            _remove(complete)
            done.append(
                f"removed {complete.name}: an interrupted run wrote it completely but never "
                f"replaced {target.name}, which is kept"
            )
        if old is not None and target.exists():
            _remove(old)
            done.append(f"removed {old.name}, the previous {target.name} already replaced")
        elif old is not None:
            os.replace(old, target)
            done.append(f"restored {target.name} from {old.name}")
    return done


def is_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Zarr store (its metadata file on top) or a netCDF / HDF5 file."""
    path = Path(path)
    if path.is_dir():
        return any((path / name).is_file() for name in _ZARR_METADATA)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(_DATASET_MAGIC)


def _check_not_a_source(target: Path, sources: Iterable[str | os.PathLike]) -> None:
    """Refuse a ``target`` that is one of ``sources``, holds one, or lies inside one."""
    resolved = target.resolve()
    for source in sources:
        source_path = Path(source).resolve()
        if resolved == source_path:
            relation = "is the input"
        elif resolved in source_path.parents:
            relation = "holds the input"
        elif source_path in resolved.parents:
            relation = "lies inside the input"
        else:
            continue
        raise MemchunkError(
            f"output {str(target)!r} {relation} {str(source)!r}: writing there would replace "
            f"or change the data being read; choose an output path outside the input"
        )


def overwrite_by_mode(mode: str | None, overwrite: bool, method: str) -> bool:
    """Whether a write replaces an existing target, from xarray's ``mode`` and ``overwrite``.

    ``mode="w"`` replaces it, as in xarray; ``"w-"`` keeps it (the default here).

    Raises
    ------
    MemchunkError
        For a mode that appends or updates (``"a"``, ``"a-"``, ``"r+"``), which a write that
        appears only once complete cannot do, or one that contradicts ``overwrite``.
    """
    if mode is None:
        return overwrite
    if mode not in ("w", "w-", "a", "a-", "r+"):
        raise MemchunkError(
            f"result.memchunk.{method}(mode={mode!r}): mode is one of xarray's, and memchunk "
            f"takes 'w' (replace an existing target) or 'w-' (keep it: the default)"
        )
    if mode not in ("w", "w-"):
        raise MemchunkError(
            f"result.memchunk.{method}(mode={mode!r}): memchunk writes a whole new dataset, which "
            f"appears only once complete, so it does not append or update one; use mode='w' (or "
            f"overwrite=True) to replace it, or xarray's own result.{method}(..., mode={mode!r}), "
            f"which writes in place"
        )
    if mode == "w-" and overwrite:
        raise MemchunkError(
            f"result.memchunk.{method}(mode='w-', overwrite=True) says both keep and replace an "
            f"existing target: pass one of them"
        )
    return overwrite or mode == "w"


def refuse_delayed_write(compute: bool, method: str) -> None:
    """Refuse ``compute=False``: an atomic write is one this process runs to its end.

    Raises
    ------
    MemchunkError
        Where ``compute`` is False (xarray's way of asking for a delayed write).
    """
    if compute is True:
        return
    if compute is not False:
        raise MemchunkError(
            f"result.memchunk.{method}(compute={compute!r}): compute is True or False"
        )
    raise MemchunkError(
        f"result.memchunk.{method}(compute=False): memchunk writes into a hidden store beside "
        f"the target and moves it into place once every chunk is written, or removes it where "
        f"the write fails, so it runs the write itself and has no delayed write to return. "
        f"Call result.memchunk.{method}(path) where the data are to be written, or use "
        f"xarray's own result.{method}(path, compute=False), which writes in place and leaves "
        f"a partial write where it fails"
    )


def check_target(
    target: str | os.PathLike,
    overwrite: bool,
    sources: Iterable[str | os.PathLike] = (),
    option: str = "overwrite=True",
    replaceable: tuple[Callable[[Path], bool], str] | None = None,
) -> Path:
    """Fail before any computation unless writing ``target`` loses nothing the user has.

    Parameters
    ----------
    target
        The output path.
    overwrite
        Whether an existing ``target`` may be replaced; it must then be a dataset
        (:func:`is_dataset`).
    sources
        Paths of the inputs: the target may not be one, hold one, or lie inside one (compared
        with symlinks resolved).
    option
        How the caller's user allows the replacement, in the messages: the argument, or the
        command line's ``--overwrite``.
    replaceable
        What ``overwrite`` may replace: a test of the existing target and what it names, in
        the messages; None, a dataset (:func:`is_dataset`).

    Returns
    -------
    Path
        ``target``.

    Raises
    ------
    MemchunkError
        When the target's directory does not exist, is not a directory or cannot be written,
        the target overlaps an input, or it exists and either ``overwrite`` is False or it is
        not a dataset.
    """
    target = Path(target)
    if not target.parent.exists():
        raise MemchunkError(f"output directory {str(target.parent)!r} does not exist")
    if not target.parent.is_dir():
        raise MemchunkError(f"output directory {str(target.parent)!r} is not a directory")
    if not os.access(target.parent, os.W_OK | os.X_OK):  # a read-only mount too, for root
        raise MemchunkError(
            f"output directory {str(target.parent)!r} cannot be written (read-only, or no "
            f"permission): choose an output path in a directory you can write"
        )
    _check_not_a_source(target, sources)
    if not (target.exists() or target.is_symlink()):
        return target
    if not overwrite:
        raise MemchunkError(f"output {str(target)!r} exists; pass {option} to replace it")
    test, kind = replaceable or (is_dataset, "a dataset (a Zarr store or a netCDF/HDF5 file)")
    if not test(target):
        raise MemchunkError(
            f"output {str(target)!r} exists and is not {kind}: {option} replaces only "
            f"{kind}, never other files or directories; choose another output path, or move "
            f"{str(target)!r} away yourself"
        )
    return target


def _files_read_by(ds: xr.Dataset) -> set[str]:
    """The files a write of ``ds`` may not replace: those it reads.

    Those ``ds`` and its variables say they were opened from (``encoding["source"]``), and
    those its Dask graphs read (:func:`~xarray_memchunk.operators.sources.source_files`).
    """
    encodings = [ds.encoding, *(v.encoding for v in ds.variables.values())]
    return {str(e["source"]) for e in encodings if e.get("source")} | source_files(ds)


def uniform_chunks(var: xr.Variable | xr.DataArray) -> dict[str, int]:
    """A variable's longest chunk per dim: storage formats want equal chunks but the last.

    Per variable: those of a Dataset may be chunked apart along a dim (a median keeps a
    variable without the reduced dim as it came), and each is stored in its own chunks.
    """
    return {str(d): max(c) for d, c in zip(var.dims, var.chunks or (), strict=False)}


def _storage_chunks(
    ds: xr.Dataset, given: Mapping[str, int] | None
) -> dict[Hashable, dict[str, int]]:
    """Each Dask-backed variable's chunk per dim in the file: ``given``, else its longest."""
    return {
        name: uniform_chunks(var) | {d: int(given[d]) for d in var.dims if given and d in given}
        for name, var in ds.variables.items()
        if var.chunks is not None
    }


def safe_write(
    obj: xr.Dataset | xr.DataArray,
    target: str | os.PathLike,
    *,
    overwrite: bool = False,
    compute: Callable[[Any], None] | None = None,
    fmt: str | None = None,
    storage_chunks: Mapping[str, int] | None = None,
    sources: Iterable[str | os.PathLike] = (),
    option: str = "overwrite=True",
) -> Path:
    """Write ``obj`` to a Zarr store or netCDF file (by suffix), atomically.

    Parameters
    ----------
    obj
        The (lazy) result.
    target
        Output path; ``.nc`` and similar suffixes write netCDF4, anything else Zarr.
    overwrite
        Replace an existing target (only once the new one is complete).
    compute
        Called with the delayed write to run it (e.g. on a distributed client with a
        progress bar); ``dask.compute`` by default.
    fmt
        ``"zarr"`` or ``"netcdf"``; by the target's suffix when None.
    storage_chunks
        Chunk length per dim in the file. Each Dask chunk must then be a whole number of them
        (the last of a dim excepted), so that no two tasks write one storage chunk. None: the
        longest Dask chunk per dim (the Dask chunks are made uniform first).
    sources
        Paths of the inputs, which ``target`` may not be, hold, or lie inside; the files
        ``obj`` was opened from (its ``encoding["source"]``) and those its Dask graphs read
        (:func:`~xarray_memchunk.operators.sources.source_files`) are added.
    option
        How the caller's user allows replacing a target, in the messages (:func:`check_target`).

    Returns
    -------
    Path
        The target.

    Raises
    ------
    MemchunkError
        Before anything is computed, when :func:`check_target` refuses the target or a
        DataArray has no name, or (a ``BudgetError``) the dask config key ``num_workers``
        is not a whole number of at least 1.
    """
    for message in recover(target):
        warnings.warn(message, RecoveredWriteWarning, stacklevel=2)
    if isinstance(obj, xr.DataArray) and obj.name is None:
        raise MemchunkError(
            "the DataArray has no name, and a file needs one for its variable: name it first, "
            "e.g. result.rename('dip')"
        )
    ds = obj.to_dataset() if isinstance(obj, xr.DataArray) else obj
    read = {*map(str, sources), *_files_read_by(ds)}
    target = check_target(target, overwrite, read, option)
    chunks = _storage_chunks(ds, storage_chunks)
    if storage_chunks is None:  # each variable's chunks made uniform, on its own
        ds = ds.assign({n: ds[n].chunk(c) for n, c in chunks.items() if n in ds.data_vars})
        ds = ds.assign_coords(
            {
                n: ds.variables[n].chunk(c)
                for n, c in chunks.items()
                if n in ds.coords and n not in ds.indexes
            }
        )

    def write(tmp: Path) -> None:
        if (fmt or output_format(target)) == "netcdf":
            encoding = {
                name: {"chunksizes": tuple(chunks[name][d] for d in var.dims)}
                for name, var in ds.data_vars.items()
                if name in chunks
            }
            delayed = ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding, compute=False)
        else:
            for name, var in ds.variables.items():
                var.encoding.pop("preferred_chunks", None)
                if storage_chunks is not None and name in chunks:
                    var.encoding["chunks"] = tuple(chunks[name][d] for d in var.dims)
                else:
                    var.encoding.pop("chunks", None)
            delayed = ds.to_zarr(tmp, mode="w-", compute=False, consolidated=True)
        _run_write(delayed, compute)

    return _written_into_place(target, write)


def _written_into_place(target: Path, write: Callable[[Path], None]) -> Path:
    """``write`` called with a hidden name beside ``target``, moved into place once it returns.

    Steps 1-5 of the module docstring; where ``write`` fails, what it wrote is removed and
    ``target`` is untouched.
    """
    write_id = uuid.uuid4().hex[:8]
    tmp = _piece(target, "partial", write_id)
    try:
        write(tmp)
    except BaseException:
        _remove(tmp)
        raise
    try:
        _move_into_place(tmp, target, write_id)
    except BaseException:  # Ctrl-C, SIGTERM between two renames: finish or undo them
        recover(target)
        raise
    return target


def _run_write(delayed: Any, compute: Callable[[Any], None] | None) -> None:
    """Run the delayed write; where it fails, return only once none of its tasks still runs.

    Dask raises a task's error as soon as it reaches the caller, while other tasks of the
    write may still be writing their chunks: removing the partial write then left the chunks
    they wrote after it (a failing function's write with no cluster left one in 2 of 3 runs).
    Where the scheduler is Dask's threaded one, the write runs in a pool of its own, whose
    running tasks are waited for; where it is a distributed client's (or ``compute`` is given
    and a client is active), the workers are asked until none of the write's tasks runs
    (:func:`_wait_for_running`). Dask's ``processes`` scheduler waits for its own pool, and
    ``sync`` runs one task at a time. A ``compute`` given with no client waits for its own
    tasks.

    Parameters
    ----------
    delayed
        The write, as xarray's ``to_zarr`` or ``to_netcdf`` returns it with ``compute=False``.
    compute
        Runs it; None: :func:`dask.compute` on the active scheduler.
    """
    import dask
    import dask.threaded

    scheduler = dask.base.get_scheduler(collections=[delayed])
    if compute is None and scheduler is dask.threaded.get:
        compute_in_own_pool(delayed, threaded_scheduler_threads())
        return
    client = getattr(scheduler, "__self__", None) if compute is None else active_client()
    try:
        (compute or dask.compute)(delayed)
    except BaseException:
        if client is not None and callable(getattr(client, "run", None)):
            _wait_for_running(client, delayed)
        raise


def compute_in_own_pool(delayed: Any, threads: int) -> None:
    """Compute ``delayed`` on Dask's threaded scheduler in a pool of ``threads`` of its own.

    It returns, an error or an interrupt included, only once none of its tasks still runs,
    so that what they write may be removed. The pool is given to this compute alone: set in
    dask's config, which every thread shares, another thread's compute would take it and
    lose its tasks when it shuts down.

    Parameters
    ----------
    delayed
        What to compute.
    threads
        Tasks run at once.
    """
    import dask
    import dask.threaded

    pool = dask.threaded.ContextAwareThreadPoolExecutor(threads)
    try:
        dask.compute(delayed, scheduler="threads", pool=pool)
    finally:  # on an error or an interrupt: no task still writing when it returns
        pool.shutdown(wait=True, cancel_futures=True)


def _wait_for_running(client: Any, delayed: Any) -> None:
    """Wait until no worker of ``client`` runs a task of ``delayed``'s graph.

    A task whose result is no longer wanted runs on to its end in its worker. Workers that do
    not answer (killed, restarting) are left out; the others are asked again, less often as
    the wait goes on, for at most :data:`WRITE_SETTLE_SECONDS`.

    Parameters
    ----------
    client
        The distributed client the write ran on.
    delayed
        The write.
    """
    import time

    keys = {str(key) for key in delayed.__dask_graph__()}
    deadline = time.monotonic() + WRITE_SETTLE_SECONDS
    pause = 0.05
    while time.monotonic() < deadline:
        try:
            running = client.run(_running_tasks, on_error="ignore")
        except Exception:  # the cluster is gone or going: nothing of it writes
            return
        answers = [r for r in running.values() if isinstance(r, set)]
        if keys.isdisjoint(set().union(*answers)):
            return
        time.sleep(pause)
        pause = min(1.0, 2 * pause)


def _running_tasks(dask_worker: Any) -> set[str]:
    """The keys of the tasks ``dask_worker`` runs, cancelled ones included (as ``str``)."""
    state = dask_worker.state
    return {str(task.key) for task in (*state.executing, *state.long_running)}


def write_segy(
    volume: Any, path: str | os.PathLike, *, overwrite: bool = False, **options: Any
) -> Path:
    """Write a 3-D (inline, crossline, sample) volume as a post-stack SEG-Y rev 1 file, safely.

    The file is written under a hidden name beside ``path`` and moved into place once complete,
    as :func:`safe_write` writes (see the module docstring): an interrupted write leaves
    nothing where ``path`` is, and what was there is kept. ``path`` may not be a file the
    volume is read from (``write_segy(open_segy(p) * 2, p)`` is refused before anything is
    computed), nor an existing file unless ``overwrite=True``, which replaces only a SEG-Y
    file. The volume is computed one row of its chunks along the outer axis at a time
    (:func:`~xarray_memchunk.seismic.segy.write_volume`).

    Parameters
    ----------
    volume
        Anything indexable like a 3-D array: NumPy, Dask, an xarray DataArray.
    path
        The file to write.
    overwrite
        Replace an existing SEG-Y file at ``path`` (once the new one is complete).
    **options
        The file's layout and headers, as :func:`~xarray_memchunk.seismic.segy.write_volume`
        takes them: ``sample_format``, ``endian``, ``sorting``, ``sample_interval_ms``,
        ``first_inline``, ``first_crossline``, ``trace_present``, ``origin``, ``bin_size``,
        ``coordinate_scalar``.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    MemchunkError
        Before anything is computed, where :func:`check_target` refuses ``path``, or an
        option is not one SEG-Y can hold.
    """
    for message in recover(path):
        warnings.warn(message, RecoveredWriteWarning, stacklevel=2)
    sources: set[str] = set()
    if isinstance(volume, xr.DataArray) or hasattr(volume, "dask"):
        array = xr.DataArray(volume) if not isinstance(volume, xr.DataArray) else volume
        sources = _files_read_by(array.rename(array.name or "volume").to_dataset())
    target = check_target(path, overwrite, sources, replaceable=(is_segy, "a SEG-Y file"))
    return _written_into_place(target, lambda tmp: write_volume(volume, tmp, **options))


def _move_into_place(tmp: Path, target: Path, write_id: str) -> None:
    """Steps 2 to 5 of the module docstring: the written ``tmp`` replaces ``target``."""
    complete = _piece(target, "complete", write_id)
    os.replace(tmp, complete)
    if target.exists() or target.is_symlink():
        old = _piece(target, "old", write_id)
        os.replace(target, old)
        os.replace(complete, target)
        _remove(old)
    else:
        os.replace(complete, target)

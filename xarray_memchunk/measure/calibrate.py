"""Calibrate an operator's memory model on this machine: profile tasks in a worker, fit, save.

    import xarray_memchunk as xm
    xm.calibrate("gst3d")               # or, from a shell: memchunk calibrate gst3d

The calibration is written to the user calibration directory (see
:mod:`xarray_memchunk.models.calibration`) and takes precedence over the shipped one.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.metadata
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MemchunkError
from ..models.calibration import save_calibration, writable_calibration_dir
from ..models.fitting import (
    LinearFit,
    fit_linear,
    time_per_element,
)
from ..models.profiling import (
    TaskProfile,
    measure_device_peak,
    measure_peak,
    peak_method,
    profile_in_worker,
)
from ..operators import Cost, DimUse, Operator, get_operator
from ..operators.cost import bind_cost, with_squared_extents
from ..planning.candidates import padded_extent
from ..planning.problem import Halo

__all__ = [
    "calibration_metadata",
    "profiling_client",
    "trusted_range",
    "worker_statuses",
    "ProfileFit",
    "measures_in_cluster",
    "calibrate",
    "calibration_key",
    "features_of",
    "task_cost",
    "fit_profiles",
    "fit_record",
    "run_task",
]

#: A calibration shape: chunk extents per dim, or (extents, sizes of the whole array) for a
#: task whose graph spans several chunks (a tree reduction over a chunked dim).
Shape = Mapping[str, int] | tuple[Mapping[str, int], Mapping[str, int]]


#: The packages whose versions a calibration file records, by distribution name.
RECORDED_PACKAGES = ("numpy", "scipy", "dask", "distributed", "xarray", "scikit-learn")


def _versions() -> dict[str, str]:
    """The versions of this package, :data:`RECORDED_PACKAGES` and Python.

    Read from the installed distributions' metadata, not by importing them: a plan that
    self-calibrates in a probe process (no cluster) never imports ``distributed`` otherwise,
    and importing it here to read its version took 0.24-0.29 s of that plan (1.3 s beside
    other work).
    """
    from .._version import __version__

    installed = {}
    for name in RECORDED_PACKAGES:
        try:
            installed[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed[name] = "not installed"
    return {"xarray_memchunk": __version__, **installed, "python": platform.python_version()}


def _machine() -> dict[str, Any]:
    import psutil

    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
    }


def _split_shape(shape: Shape) -> tuple[dict[str, int], dict[str, int]]:
    """``(extents, sizes)`` of a calibration shape; a one-chunk array when sizes are not given."""
    if isinstance(shape, tuple):
        extents, sizes = shape
    else:
        extents = sizes = shape
    extents = {str(d): int(n) for d, n in extents.items()}
    return extents, {d: int(sizes.get(d, n)) for d, n in extents.items()}


def task_cost(
    operator: Operator,
    extents: Mapping[str, int],
    dtype: str,
    kwargs: Mapping[str, Any],
    sizes: Mapping[str, int] | None = None,
) -> tuple[dict[str, DimUse], Cost]:
    """How ``operator`` uses the dims of an array of ``sizes``, and its cost there.

    As planning resolves them (:func:`~xarray_memchunk.operators.cost.bind_cost`), on a
    template of ``dtype`` that holds no data.

    Parameters
    ----------
    extents
        Chunk extents per dim: the template's dims, in order.
    sizes
        Lengths of the whole array; ``extents`` (one chunk) when None.
    """
    import xarray as xr

    sizes = dict(sizes or extents)
    template = xr.DataArray(
        np.broadcast_to(np.zeros((), dtype=dtype), tuple(sizes[d] for d in extents)),
        dims=list(extents),
    )
    return bind_cost(operator, template, kwargs)


def features_of(
    operator: Operator,
    extents: Mapping[str, int],
    dtype: str,
    kwargs: Mapping[str, Any],
    sizes: Mapping[str, int] | None = None,
    squared_dims: Sequence[str] = (),
) -> dict[str, float]:
    """The memory-model features of one task, as the planner computes them.

    Parameters
    ----------
    extents
        Chunk extents per dim (without halo: it is added as the planner adds it).
    sizes
        Lengths of the whole array; ``extents`` (one chunk) when None.
    squared_dims
        Dims whose squared extent is a feature too
        (:func:`~xarray_memchunk.operators.cost.with_squared_extents`).
    """
    sizes = dict(sizes or extents)
    uses, cost = task_cost(operator, extents, dtype, kwargs, sizes)
    features = with_squared_extents(cost.features, list(squared_dims), np.dtype(dtype).itemsize)
    depths = {d: u.depth for d, u in uses.items()}
    padded = {d: np.array([n]) for d, n in padded_block(extents, sizes, depths).items()}
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in features(padded).items()}


def padded_block(
    extents: Mapping[str, int], sizes: Mapping[str, int], depths: Mapping[str, Halo]
) -> dict[str, int]:
    """A block's extents padded as the planner pads the middle task of each dim.

    :func:`~xarray_memchunk.planning.candidates.padded_extent` with the number of chunks of
    that length along the whole array (``sizes``); a dim missing from ``depths`` has no halo.
    """
    return {
        d: int(padded_extent(n, -(-sizes[d] // n), depths.get(d, 0))) for d, n in extents.items()
    }


#: Bytes of the data a self-calibration takes its blocks' values from (:func:`value_sample`):
#: half of :data:`~xarray_memchunk.measure.self_calibration.QUIET_BYTES`, as a block's
#: request carries them.
SAMPLE_BYTES = 2**19


def value_sample(da: Any) -> np.ndarray | None:
    """Values of ``da`` for self-calibration's blocks: at most :data:`SAMPLE_BYTES`, as 1-D.

    Every few elements along each dim of its middle chunk, spread over the whole chunk (a
    land mask at the chunk's centre is sampled in its share, not as all of it). One chunk of a
    Dask graph is computed, in this thread, by Dask's synchronous scheduler. None for data not
    on the CPU, or where reading them fails: the blocks then hold generated values.
    """
    data = getattr(da, "data", None)
    if data is None or getattr(da, "size", 0) == 0:
        return None
    if not isinstance(getattr(data, "_meta", data), np.ndarray):
        return None
    try:
        chunks = getattr(data, "chunks", None) or tuple((n,) for n in da.shape)
        lengths = [int(c[len(c) // 2]) for c in chunks]
        starts = [int(sum(c[: len(c) // 2])) for c in chunks]
        steps = _sample_steps(lengths, SAMPLE_BYTES // max(1, np.dtype(da.dtype).itemsize))
        region = tuple(
            slice(start, start + length, step)
            for start, length, step in zip(starts, lengths, steps, strict=True)
        )
        sample = data[region]
        if hasattr(sample, "compute"):  # this call's scheduler, not the process's config
            sample = sample.compute(scheduler="sync")
        values = np.asarray(sample)
    except Exception:  # unknown chunk sizes, an unreadable region: the blocks are generated
        return None
    return values.reshape(-1)


def _sample_steps(lengths: Sequence[int], elements: int) -> list[int]:
    """Steps along each dim that take at most ``elements`` of a box of ``lengths``."""
    steps = [1] * len(lengths)

    def taken(axis: int) -> int:
        return -(-lengths[axis] // steps[axis])

    while math.prod(taken(a) for a in range(len(lengths))) > max(1, elements):
        widest = max(range(len(lengths)), key=taken)  # the dim that takes the most
        steps[widest] = min(lengths[widest], 2 * steps[widest])
    return steps


def _filled_with(template: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A block of ``template``'s shape and dtype, ``values`` repeated in it."""
    return np.resize(values.astype(template.dtype, copy=False), template.shape)


def run_task(
    operator: Operator,
    kwargs: Mapping[str, Any],
    extents: Mapping[str, int],
    sizes: Mapping[str, int],
    dtype: str,
    seed: int,
    *,
    on_gpu: bool = False,
    upstream: bool = False,
    coords: Mapping[str, np.ndarray] | None = None,
    values: np.ndarray | None = None,
) -> None:
    """Run one task of ``operator`` as the graph that ``apply`` builds runs it.

    The input is a Dask array of ``sizes`` in chunks of ``extents``, generated inside the graph
    (so that, as with data read from a file, producing the input fuses into the task); with
    ``on_gpu``, each block is generated on the current GPU by CuPy. The operator's lazy result
    is built as ``apply`` builds it, and the graph of its middle output block is computed in
    this thread: for a one-chunk array that is the one fused task; for a tree reduction over a
    chunked dim, its chunk tasks and the combine tasks that hold their partial results.
    ``upstream``: the input is float64 normal data scaled, shifted and cast to ``dtype`` in the
    graph, as preprocessing makes it (producing it then holds more than the block).
    ``coords``: the coordinates of the data the operator is measured for, ``name -> (dims,
    values)``, each cut to its first ``sizes[dim]`` values along its dims (a climatology needs
    the data's dates, a weighting its latitudes). ``values``: a sample of the data's own
    values (:func:`value_sample`), repeated to fill each block, in place of generated ones: a
    function whose memory depends on the values (the points below zero) is measured on values
    like those it will run on.
    """
    import dask
    import dask.array as da
    import xarray as xr
    from dask.local import get_sync

    dims = list(extents)
    shape, chunks = tuple(sizes[d] for d in dims), tuple(extents[d] for d in dims)
    if on_gpu:  # each block made on the device, by CuPy's generator
        import cupy

        data = da.map_blocks(
            _device_block,
            da.empty(shape, chunks=chunks, dtype=dtype),
            seed,
            dtype=dtype,
            meta=cupy.empty((0,) * len(dims), dtype=dtype),
        )
    elif values is not None and values.size:
        data = da.map_blocks(
            functools.partial(_filled_with, values=values),
            da.empty(shape, chunks=chunks, dtype=dtype),
            dtype=dtype,
            meta=np.empty((0,) * len(dims), dtype=dtype),
        )
    elif upstream:
        normal = da.random.default_rng(seed).standard_normal(shape, chunks=chunks)
        data = (normal * 2.0 + 1.0).astype(dtype)
    elif np.dtype(dtype) in (np.float32, np.float64):  # the generator's own dtypes
        data = da.random.default_rng(seed).random(shape, chunks=chunks, dtype=dtype)
    elif np.dtype(dtype).kind == "f":  # float16 and the like: made in float64, then cast
        data = da.random.default_rng(seed).random(shape, chunks=chunks).astype(dtype)
    else:  # integers (seismic counts): uniform values within the dtype, made in the graph
        data = (da.random.default_rng(seed).random(shape, chunks=chunks) * 100).astype(dtype)
    own = {
        name: (dims, np.asarray(values)[tuple(slice(0, sizes[d]) for d in dims)])
        for name, (dims, values) in (coords or {}).items()
        if set(dims) <= set(sizes)
    }
    obj = xr.DataArray(data, dims=dims, coords=own)
    uses = operator.dims(obj, **kwargs)
    result = operator.compute(obj, uses, **kwargs)
    arrays = result.data_vars.values() if isinstance(result, xr.Dataset) else [result]
    blocks = []
    for array in arrays:
        lazy = array.data
        if hasattr(lazy, "blocks") and lazy.ndim:
            lazy = lazy.blocks[tuple(n // 2 for n in lazy.numblocks)]
        blocks.append(lazy)
    # dask.local.get_sync itself, not the name "synchronous": a named scheduler makes Dask
    # import distributed to look for a client (0.2-0.3 s in a fresh measuring process)
    with dask.config.set(scheduler="synchronous"):  # for the operator's own computes
        dask.compute(*blocks, scheduler=get_sync)


def _device_block(template, seed: int, block_id=None):
    """Uniform values of ``template``'s shape and dtype on the current GPU."""
    import cupy

    rng = cupy.random.default_rng(
        int(np.random.SeedSequence([seed, *block_id]).generate_state(1)[0])
    )
    if template.dtype.kind == "f":
        return rng.random(template.shape, dtype=template.dtype)
    return (rng.random(template.shape, dtype=np.float32) * 100).astype(template.dtype)


@dataclass(frozen=True)
class ProfileFit:
    """What the profiles of one dtype give: the memory model and the time per element.

    Attributes
    ----------
    memory
        The fitted memory model.
    seconds_per_element
        Median time per element and pass of the larger half of the tasks.
    work_per_element
        The operator's :attr:`~xarray_memchunk.operators.base.Cost.work_per_element` that
        ``seconds_per_element`` was measured at (:func:`~xarray_memchunk.models.fitting.
        time_per_element`); None where the operator's work per element does not depend on the
        array, for a GPU's profiles, or where no task took any time.
    """

    memory: LinearFit
    seconds_per_element: float
    work_per_element: float | None


def fit_profiles(
    operator: Operator,
    profiles: Sequence[TaskProfile],
    kwargs: Mapping[str, Any],
    squared_dims: Sequence[str] = (),
    device: str = "cpu",
) -> ProfileFit:
    """Fit the memory model, the time per element and pass, and the work it was timed at.

    The work (:class:`ProfileFit`) only for a CPU's profiles: a GPU's time per element did
    not follow the operator's work (the ``svd-gpu`` profiles).
    """
    first = profiles[0]
    cost = task_cost(operator, first.extents, first.dtype, kwargs, first.sizes)[1]
    rows = [
        features_of(operator, p.extents, p.dtype, kwargs, p.sizes, squared_dims) for p in profiles
    ]
    features = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    fit = fit_linear(features, np.array([p.peak_bytes for p in profiles]))
    elements = np.array([np.prod(list(p.sizes.values()), dtype=float) for p in profiles])
    work = cost.work_per_element if device == "cpu" else None
    works = None if work is None else np.array([work(p.sizes) for p in profiles])
    per_element, measured_at = time_per_element(
        elements, np.array([p.seconds for p in profiles]), works
    )
    return ProfileFit(fit, per_element / cost.passes, measured_at)


def calibrate(
    op: str | Operator,
    *,
    dtypes: Sequence[str] = ("float32", "float64"),
    shapes: Sequence[Shape] | None = None,
    repeats: int = 3,
    client=None,
    save: bool = True,
    directory: str | os.PathLike | None = None,
    device: str = "cpu",
    **op_kwargs: Any,
) -> dict[str, dict[str, Any]]:
    """Profile ``op`` inside a Dask worker, fit its memory model, and save it as JSON.

    Parameters
    ----------
    op
        Operator name or object; custom operators work the same way.
    dtypes
        Input dtypes to calibrate.
    shapes
        Chunk extents to profile (dim -> length), or ``(extents, sizes)`` pairs for tasks of
        a larger array; the operator's ``calibration_setup()`` shapes by default.
    repeats
        Runs per shape (the median peak is fitted).
    client
        A ``distributed.Client`` whose first worker runs the profiles; by default a
        child process is started for them (:func:`profiling_client`).
    save
        Write the calibration file.
    directory
        Where to write it (the user calibration directory by default).
    device
        ``"cpu"``: NumPy chunks, the worker's resident memory measured. ``"gpu"``: CuPy
        chunks on the worker's current GPU, its device memory measured (CuPy's memory pool,
        :func:`~xarray_memchunk.models.profiling.measure_device_peak`); plans for CuPy data
        use it.
    **op_kwargs
        The operator's arguments (e.g. ``kernel="d2geo"``, ``dim="time"``).

    Returns
    -------
    dict
        The fits written, by dtype.
    """
    operator = get_operator(op)
    if device not in operator.devices:
        raise MemchunkError(
            f"device must be one of {operator.devices} for {operator.name!r}, got {device!r}"
        )
    if save:  # before measuring: a directory that cannot be written fails now, not after
        writable_calibration_dir(directory)
    shapes = list(shapes) if shapes is not None else None  # read twice: setup, then the key
    kwargs, cases = _setup(operator, op_kwargs, shapes)
    runner, measure = (
        (functools.partial(run_task, on_gpu=True), measure_device_peak)
        if device == "gpu"
        else (run_task, measure_peak)
    )
    fits: dict[str, dict[str, Any]] = {}
    with profiling_client(client) as profiler:
        method = (
            "cupy-pool" if device == "gpu" else profiler.submit(peak_method, pure=False).result()
        )
        for dtype in dtypes:
            profiles = profile_in_worker(
                profiler,
                runner,
                [(e, n, (operator, kwargs, e, n, dtype)) for e, n in cases],
                dtype,
                repeats,
                measure=measure,
            )
            fits[dtype] = fit_record(operator, profiles, kwargs, device=device)
    if save:
        save_calibration(
            calibration_key(operator, op_kwargs, shapes, next(iter(fits), "float64")),
            device,
            fits,
            calibration_metadata(method, kwargs),
            Path(directory) if directory is not None else None,
        )
    return fits


def _setup(
    operator: Operator, op_kwargs: Mapping[str, Any], shapes: Sequence[Shape] | None
) -> tuple[dict[str, Any], list[tuple[dict[str, int], dict[str, int]]]]:
    """The arguments :func:`calibrate` profiles ``operator`` with, and its ``(extents, sizes)``.

    Raises
    ------
    MemchunkError
        On invalid arguments, or when no shapes are given and the operator has no default ones.
    """
    kwargs, default = operator.calibration_setup(**op_kwargs)
    shapes = list(shapes) if shapes is not None else default
    if not shapes:
        raise MemchunkError(
            f"operator {operator.name!r} has no default calibration shapes: pass shapes=[{{dim: "
            f"length, ...}}, ...] to calibrate()"
        )
    return kwargs, [_split_shape(shape) for shape in shapes]


def calibration_key(
    op: str | Operator,
    op_kwargs: Mapping[str, Any],
    shapes: Sequence[Shape] | None = None,
    dtype: str = "float64",
) -> str:
    """The key :func:`calibrate` saves ``op``'s calibration under, with these arguments.

    What runs teach about the operator is kept under the same key
    (:mod:`~xarray_memchunk.measure.runs`). It is the operator's
    :attr:`~xarray_memchunk.operators.base.Cost.calibration_key` on the first task calibration
    profiles (of ``dtype``).
    """
    operator = get_operator(op)
    kwargs, cases = _setup(operator, op_kwargs, shapes)
    (extents, sizes) = cases[0]
    return task_cost(operator, extents, dtype, kwargs, sizes)[1].calibration_key


def fit_record(
    operator: Operator,
    profiles: Sequence[TaskProfile],
    kwargs: Mapping[str, Any],
    *,
    measured_range: bool = False,
    squared_dims: Sequence[str] = (),
    resident: tuple[int, int] | None = None,
    next_peak: float | None = None,
    whole_array: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The JSON record of a fit to ``profiles``: coefficients, errors, and the profiles.

    ``measured_range``: record the largest task plans may reach (``max_task_elements``, see
    :func:`trusted_range`): self-calibration measures small tasks only. ``squared_dims``: dims
    along which memory grew faster than the block: their squared extents are features, and
    plans stay within the largest extent measured along them (``max_extents``). ``resident``:
    the measuring process's resident memory before and after the runs
    (``resident_before_bytes``, ``resident_after_bytes``): what running the operator leaves in
    a worker (:meth:`~xarray_memchunk.models.calibration.Calibration.held_after_running`).
    ``next_peak``: the peak extrapolated for the block twice the largest, where it was over the
    per-task budget and stopped the blocks from growing (``next_block_peak_bytes``): a plan
    whose budget holds it measures larger blocks. ``whole_array``: the elements of the array
    measured, where the blocks grew to all of it (``whole_array_elements``): a plan of a larger
    array measures larger blocks. ``device``: where the profiles ran; on a CPU,
    where the operator's work per element depends on the array, the work its time per element
    was measured at (``work_per_element``, :class:`ProfileFit`).
    """
    fitted = fit_profiles(operator, profiles, kwargs, squared_dims, device)
    fit, seconds = fitted.memory, fitted.seconds_per_element
    stats: dict[str, float] = {
        "lift_bytes": fit.lift,
        "median_abs_pct_error": fit.median_abs_pct_error,
        "worst_under_pct": fit.worst_under_pct,
        "worst_over_pct": fit.worst_over_pct,
        "n_profiles": fit.n_profiles,
    }
    if measured_range:
        stats["max_task_elements"] = trusted_range(profiles)
    if next_peak is not None:
        stats["next_block_peak_bytes"] = next_peak
    if whole_array is not None:
        stats["whole_array_elements"] = whole_array
    if fitted.work_per_element is not None:
        stats["work_per_element"] = fitted.work_per_element
    if resident is not None and all(resident):  # 0: not measurable here
        stats["resident_before_bytes"], stats["resident_after_bytes"] = resident
    if squared_dims:
        stats["squared_dims"] = list(squared_dims)
        stats["max_extents"] = {
            d: max(p.extents[d] for p in profiles if d in p.extents) for d in squared_dims
        }
    return {
        "coefficients": fit.coefficients,
        "intercept": fit.intercept,
        "seconds_per_element": seconds,
        "fit": stats,
        "profiles": [
            {
                "extents": p.extents,
                "sizes": p.sizes,
                "peak_bytes": p.peak_bytes,
                "peak_spread": p.peak_spread,
                "seconds": p.seconds,
                "runs": p.runs,
            }
            for p in profiles
        ],
    }


def calibration_metadata(method: str, kwargs: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A calibration file's ``metadata``: when and where it was measured, how, with what."""
    return {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": _versions(),
        "machine": _machine(),
        "method": method,
        "operator_kwargs": {k: _as_json(v) for k, v in kwargs.items() if v is not None},
        **extra,
    }


def _as_json(value: Any) -> Any:
    """``value`` as a calibration file holds an argument: itself where JSON has it, else said.

    A user's function given a lookup table (a NumPy or Dask array) failed its first plan with
    "Object of type ndarray is not JSON serializable": an array is described by its type,
    dtype and shape, anything else by its ``repr`` (at most 200 characters).
    """
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape is not None and dtype is not None:
            return f"{type(value).__name__} of {dtype}, shape {tuple(shape)}"
        return repr(value)[:200]
    return value


#: Peak growth over element growth, between the two largest blocks measured, up to which a
#: model counts as linear.
LINEAR_GROWTH = 1.05
#: How far beyond its largest measured block a model that grew linearly is trusted.
EXTRAPOLATION = 2.0


def trusted_range(profiles: Sequence[TaskProfile]) -> float:
    """Largest task (elements) a model fitted to ``profiles`` may be planned for.

    Twice the largest block measured when the peak grew in proportion to the block between the
    two largest (within :data:`LINEAR_GROWTH`); the largest block itself when it grew faster:
    a function whose memory outgrows its block is not extrapolated. What the blocks never
    reached (a cost that starts only past some size) runs teach
    (:mod:`xarray_memchunk.measure.runs`).
    """
    ranked = sorted(profiles, key=lambda p: math.prod(p.extents.values()))
    largest = float(math.prod(ranked[-1].extents.values()))
    if len(ranked) < 2 or ranked[-2].peak_bytes <= 0:
        return largest
    growth = ranked[-1].peak_bytes / ranked[-2].peak_bytes
    elements = largest / math.prod(ranked[-2].extents.values())
    return largest * (EXTRAPOLATION if growth <= LINEAR_GROWTH * elements else 1.0)


def _scaled_to_zero(client) -> bool:
    """Whether ``client``'s cluster adapts (``cluster.adapt``) and runs no worker now."""
    from .._dask_compat import adaptive_bounds

    if adaptive_bounds(getattr(client, "cluster", None)) is None:
        return False
    try:
        return not client.ncores()
    except Exception:  # a scheduler that cannot say: measured on the cluster, as before
        return False


def _cannot_measure_in(client) -> bool:
    """Whether ``client``'s workers cannot run a measurement now (async, or all paused).

    An asynchronous client's calls return coroutines that planning does not await: a new
    user's plan failed with "'coroutine' object is not iterable". A paused worker runs no task:
    a plan on workers of the planning process (``processes=False``), whose memory was past
    their pause line, waited for ever for its measurement's first block.
    """
    if getattr(client, "asynchronous", False):
        return True
    statuses = worker_statuses(client)  # none where it cannot say: measured there, as before
    return bool(statuses) and all(s == "paused" for s in statuses.values())


def measures_in_cluster(client) -> bool:
    """Whether :func:`profiling_client` measures in ``client``'s workers, not a child process.

    Not where ``client`` is None or asynchronous, every worker is paused, or its cluster adapts
    and runs no worker now.
    """
    return client is not None and not _scaled_to_zero(client) and not _cannot_measure_in(client)


def worker_statuses(client) -> dict[str, str]:
    """Each worker's status as ``client``'s scheduler says it now; empty where it cannot say.

    ``"running"`` or ``"paused"`` (distributed's ``Status``), by worker address.
    """
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    except Exception:
        return {}
    return {str(address): str(w.get("status", "")) for address, w in workers.items()}


@contextlib.contextmanager
def profiling_client(client, keep: bool = False):
    """Use ``client``, or a child process for the profiles (one task at a time).

    A child is used too where ``client`` is asynchronous or all its workers are paused
    (:func:`_cannot_measure_in`), and where its cluster adapts and runs no worker now: it starts
    one only for tasks, which a measurement pinned to a worker cannot send, so waiting for one
    would fail after :data:`~xarray_memchunk.models.profiling.WORKER_WAIT_SECONDS`.

    The child (:class:`~xarray_memchunk.models.probe_process.ProbeProcess`) does not import
    the caller's ``__main__`` again, as the workers of a process-based ``LocalCluster`` would:
    a plain script without a ``__main__`` guard can measure its functions. With ``keep``, it
    is kept for the next calibration that keeps one
    (:func:`~xarray_memchunk.models.probe_process.kept_probe_process`): only the first pays
    for its start.
    """
    if measures_in_cluster(client):
        yield client
        return
    from ..models.probe_process import ProbeProcess, kept_probe_process

    with kept_probe_process() if keep else ProbeProcess() as own:
        yield own

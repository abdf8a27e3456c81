"""Calibrate an operator's memory model on this machine: profile tasks in a worker, fit, save.

    import xarray_memchunk as xm
    xm.calibrate("gst3d")               # or, from a shell: memchunk calibrate gst3d

The calibration is written to the user calibration directory (see
:mod:`xarray_memchunk.models.calibration`) and takes precedence over the shipped one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .models.calibration import save_calibration
from .models.fitting import LinearFit, fit_linear
from .models.profiling import TaskProfile, peak_method, profile_in_worker
from .operators import Operator, get_operator
from .operators.cost import resolve_cost
from .planning.candidates import padded_extent

__all__ = ["calibrate", "features_of", "fit_profiles", "run_task"]

#: A calibration shape: chunk extents per dim, or (extents, sizes of the whole array) for a
#: task whose graph spans several chunks (a tree reduction over a chunked dim).
Shape = Mapping[str, int] | tuple[Mapping[str, int], Mapping[str, int]]


def _versions() -> dict[str, str]:
    import dask
    import distributed
    import scipy
    import sklearn
    import xarray

    from . import __version__

    return {
        "xarray_memchunk": __version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "xarray": xarray.__version__,
        "scikit-learn": sklearn.__version__,
        "python": platform.python_version(),
    }


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


def features_of(
    operator: Operator,
    extents: Mapping[str, int],
    dtype: str,
    kwargs: Mapping[str, Any],
    sizes: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """The memory-model features of one task, as the planner computes them.

    Parameters
    ----------
    extents
        Chunk extents per dim (without halo: it is added as the planner adds it).
    sizes
        Lengths of the whole array; ``extents`` (one chunk) when None.
    """
    import xarray as xr

    sizes = dict(sizes or extents)
    template = xr.DataArray(
        np.broadcast_to(np.zeros((), dtype=dtype), tuple(sizes[d] for d in extents)),
        dims=list(extents),
    )
    cost = resolve_cost(operator, "calibration", template, kwargs, "cpu")
    padded = {
        d: np.array(
            [padded_extent(n, -(-sizes[d] // n), cost.uses[d].depth if d in cost.uses else 0)]
        )
        for d, n in extents.items()
    }
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in cost.features(padded).items()}


def run_task(
    operator: Operator,
    kwargs: Mapping[str, Any],
    extents: Mapping[str, int],
    sizes: Mapping[str, int],
    dtype: str,
    seed: int,
) -> None:
    """Run one task of ``operator`` as the graph that ``apply`` builds runs it.

    The input is a Dask array of ``sizes`` in chunks of ``extents``, generated inside the graph
    (so that, as with data read from a file, producing the input fuses into the task). The
    operator's lazy result is built as ``apply`` builds it, and the graph of its middle
    output block is computed in this thread: for a one-chunk array that is the one fused
    task; for a tree reduction over a chunked dim, its chunk tasks and the combine tasks
    that hold their partial results.
    """
    import dask
    import dask.array as da
    import xarray as xr

    dims = list(extents)
    data = da.random.default_rng(seed).random(
        tuple(sizes[d] for d in dims), chunks=tuple(extents[d] for d in dims), dtype=dtype
    )
    obj = xr.DataArray(data, dims=dims)
    uses = operator.dim_uses(obj, **kwargs)
    result = operator.compute(obj, uses, **kwargs)
    arrays = result.data_vars.values() if isinstance(result, xr.Dataset) else [result]
    blocks = []
    for array in arrays:
        lazy = array.data
        if hasattr(lazy, "blocks") and lazy.ndim:
            lazy = lazy.blocks[tuple(n // 2 for n in lazy.numblocks)]
        blocks.append(lazy)
    with dask.config.set(scheduler="synchronous"):
        dask.compute(*blocks)


def fit_profiles(
    operator: Operator, profiles: Sequence[TaskProfile], kwargs: Mapping[str, Any]
) -> tuple[LinearFit, float]:
    """Fit the memory model and the time per element and pass to profiles of one dtype."""
    rows = [features_of(operator, p.extents, p.dtype, kwargs, p.sizes) for p in profiles]
    features = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    fit = fit_linear(features, np.array([p.peak_bytes for p in profiles]))
    elements = np.array([np.prod(list(p.sizes.values()), dtype=float) for p in profiles])
    seconds = np.array([p.seconds for p in profiles])
    large = elements >= np.median(elements)  # small tasks are dominated by fixed costs
    per_pass = seconds[large] / elements[large] / operator.cost_terms(**kwargs).passes
    return fit, float(np.median(per_pass))


def calibrate(
    op: str | Operator,
    *,
    dtypes: Sequence[str] = ("float32", "float64"),
    shapes: Sequence[Shape] | None = None,
    repeats: int = 3,
    client=None,
    save: bool = True,
    directory: str | os.PathLike | None = None,
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
        a larger array; the operator's ``calibration_shapes()`` by default.
    repeats
        Runs per shape (the median peak is fitted).
    client
        A ``distributed.Client`` whose first worker runs the profiles; by default a
        ``LocalCluster`` of one single-threaded worker without a memory limit is started.
    save
        Write the calibration file.
    directory
        Where to write it (the user calibration directory by default).
    **op_kwargs
        The operator's arguments (e.g. ``kernel="d2geo"``, ``dim="time"``).

    Returns
    -------
    dict
        The fits written, by dtype.
    """
    operator = get_operator(op)
    kwargs = operator.normalize_kwargs(**(dict(operator.calibration_kwargs) | op_kwargs))
    shapes = list(shapes) if shapes is not None else operator.calibration_shapes(**kwargs)
    cases = [_split_shape(shape) for shape in shapes]
    fits: dict[str, dict[str, Any]] = {}
    with _profiling_client(client) as profiler:
        method = profiler.submit(peak_method, pure=False).result()
        for dtype in dtypes:
            profiles = profile_in_worker(
                profiler,
                run_task,
                [(e, n, (operator, kwargs, e, n, dtype)) for e, n in cases],
                dtype,
                repeats,
            )
            fit, seconds = fit_profiles(operator, profiles, kwargs)
            fits[dtype] = {
                "coefficients": fit.coefficients,
                "intercept": fit.intercept,
                "seconds_per_element": seconds,
                "fit": {
                    "lift_bytes": fit.lift,
                    "median_abs_pct_error": fit.median_abs_pct_error,
                    "worst_under_pct": fit.worst_under_pct,
                    "worst_over_pct": fit.worst_over_pct,
                    "n_profiles": fit.n_profiles,
                },
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
    if save:
        metadata = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": _versions(),
            "machine": _machine(),
            "method": method,
            "operator_kwargs": {k: v for k, v in kwargs.items() if v is not None},
        }
        save_calibration(
            operator.cost_terms(**kwargs).calibration,
            "cpu",
            fits,
            metadata,
            Path(directory) if directory is not None else None,
        )
    return fits


@contextlib.contextmanager
def _profiling_client(client):
    """Use ``client``, or start a one-worker, one-thread LocalCluster for the profiles."""
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit=0,
            processes=True,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as own,
    ):
        yield own

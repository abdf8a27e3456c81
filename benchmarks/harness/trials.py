"""Randomized trials: the call a user writes with Dask alone, against ``memchunk.apply``.

:func:`draw` makes trial ``i`` of a seed (the same trial on every machine and in every part of
a run): an operator, a dtype, a size from 100 MB to ~3 GB, an input source and chunking, a
worker memory limit, and a cluster of 1-3 workers of 1, 2 or 4 threads. :func:`run_trial`
writes the input, then runs each side on a fresh ``LocalCluster`` (which side goes first
alternates with the trial's index), and returns one JSON-ready record.

A side's outcome is one of:

- ``completed``: a result came back (pauses and deaths on the way are recorded apart);
- ``killed``: ``KilledWorker`` (a task killed its workers too many times);
- ``hung``: no result within the side's time limit (a paused worker waiting for memory its own
  task holds), after which the cluster is closed;
- ``refused``: memchunk said before running that nothing fits, and the least
  ``memory_limit`` it would run at (that side is then run again at that limit: ``rerun``);
- ``error``: any other exception (the Dask call a user writes failed for a reason that is not
  memory: it is shown, not counted as a memory failure).
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from xarray_memchunk.errors import InfeasiblePlanError
from xarray_memchunk.testing import RunOutcome, watch
from xarray_memchunk.units import format_size_up, to_bytes

from .fresh import fresh_client
from .plan_safety import SafetyCase, _consume, _input, sum_in_float64
from .timeouts import within

__all__ = ["SIDES", "Trial", "draw", "run_trial"]

SIDES = ("dask", "memchunk")

#: Reductions over time, on a (time, lat, lon) cube.
REDUCTIONS = ("sum", "mean", "std", "var", "min", "max", "median", "quantile")
#: Operators on a (inline, crossline, sample) volume.
VOLUME_OPS = ("gst3d-gaussian", "gst3d-d2geo", "laplacian", "seed-gst3d")
#: The SVDs, on a (time, space) matrix.
MATRIX_OPS = ("svd-exact", "svd-compressed")
#: A user's NumPy function with several float64 temporaries, on the cube.
USER_CUBE_OPS = ("temporaries",)
#: The xarray expressions of :mod:`harness.climate_functions`, on the cube (daily dates).
CLIMATE_OPS = (
    "clim-month",
    "clim-doy",
    "anomaly",
    "monthly",
    "rolling-30",
    "area-mean",
    "trend",
    "anomaly-p90",
)
OPERATORS = REDUCTIONS + VOLUME_OPS + MATRIX_OPS + USER_CUBE_OPS + CLIMATE_OPS

SOURCES = {
    "cube": ("preprocessed", "file", "netcdf", "mfdataset"),
    "volume": ("preprocessed", "file", "netcdf", "mfdataset", "segy"),
    "matrix": ("preprocessed", "file", "netcdf"),
}
CHUNKINGS = ("auto", "storage", "slab", "cubes")
MEMORY_LIMITS_GB = (0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0)
THREADS = (1, 2, 4)
#: Bytes of a storage chunk (``"storage"`` chunking) and of a cube (``"cubes"``).
STORAGE_CHUNK_BYTES = 32e6
CUBE_CHUNK_BYTES = 16e6


@dataclass(frozen=True)
class Trial:
    """One drawn case (see the module's docstring)."""

    seed: int
    index: int
    op: str
    family: str
    dtype: str
    shape: dict[str, int]
    source: str
    chunking: str
    chunks: dict[str, int]
    memory_limit_gb: float
    n_workers: int
    threads: int

    @property
    def nbytes(self) -> int:
        """Bytes of the input."""
        return math.prod(self.shape.values()) * np.dtype(self.dtype).itemsize

    @property
    def first(self) -> str:
        """The side that runs first: they alternate with the index."""
        return SIDES[self.index % 2]

    @property
    def memory_limit(self) -> str:
        """The workers' ``memory_limit``, as ``LocalCluster`` takes it."""
        return f"{self.memory_limit_gb}GB"


def _family(op: str) -> str:
    if op in VOLUME_OPS:
        return "volume"
    if op in MATRIX_OPS:
        return "matrix"
    return "cube"


def _shape(rng: np.random.Generator, family: str, op: str, nbytes: float, itemsize: int):
    elements = nbytes / itemsize
    if family == "volume":
        side = elements ** (1 / 3)
        inline = int(side * rng.uniform(0.7, 1.4))
        rest = math.sqrt(elements / inline)
        return {"inline": inline, "crossline": int(rest), "sample": int(rest)}
    if family == "matrix":
        low, high = (500, 2001) if op == "svd-exact" else (4000, 30001)
        space = int(rng.integers(low, high))
        return {"time": int(elements / space), "space": space}
    time_steps = int(rng.integers(730, 7301))  # 2 to 20 years of days
    lat = max(8, int(math.sqrt(elements / time_steps / 2)))
    return {"time": time_steps, "lat": lat, "lon": 2 * lat}


def _chunks(chunking: str, shape: dict[str, int], dtype: str) -> dict[str, int]:
    """The input's chunks: Dask's auto, storage slabs of ~32 MB, one step, or cubes of ~16 MB."""
    from dask.array.core import normalize_chunks

    dims = list(shape)
    sizes = tuple(shape.values())
    itemsize = np.dtype(dtype).itemsize
    if chunking == "auto":
        auto = normalize_chunks("auto", sizes, dtype=np.dtype(dtype))
        return {d: max(c) for d, c in zip(dims, auto, strict=True)}
    first, rest = dims[0], math.prod(sizes[1:]) * itemsize
    if chunking == "storage":
        return {first: max(1, min(shape[first], int(STORAGE_CHUNK_BYTES / rest)))} | {
            d: shape[d] for d in dims[1:]
        }
    if chunking == "slab":
        return {first: 1} | {d: shape[d] for d in dims[1:]}
    side = int((CUBE_CHUNK_BYTES / itemsize) ** (1 / len(dims)))
    return {d: min(shape[d], side) for d in dims}


def draw(seed: int, index: int) -> Trial:
    """Trial ``index`` of ``seed``: drawn from its own generator, so any part of a run can be
    run alone."""
    rng = np.random.default_rng([seed, index])
    op = str(rng.choice(OPERATORS))
    family = _family(op)
    dtype = str(rng.choice(["float32", "float64"]))
    nbytes = float(np.exp(rng.uniform(np.log(100e6), np.log(3e9))))
    shape = _shape(rng, family, op, nbytes, np.dtype(dtype).itemsize)
    source = str(rng.choice(SOURCES[family]))
    chunking = str(rng.choice(CHUNKINGS))
    if family == "matrix" and chunking == "slab":
        chunking = "storage"  # one row per chunk is no way to hold a matrix
    return Trial(
        seed=seed,
        index=index,
        op=op,
        family=family,
        dtype=dtype,
        shape=shape,
        source=source,
        chunking=chunking,
        chunks=_chunks(chunking, shape, dtype),
        memory_limit_gb=float(rng.choice(MEMORY_LIMITS_GB)),
        n_workers=int(rng.integers(1, 4)),
        threads=int(rng.choice(THREADS)),
    )


# --- the two sides -------------------------------------------------------------------------


def _memchunk_call(trial: Trial) -> tuple[str, dict[str, Any]]:
    """The operator name and arguments memchunk is asked for."""
    if trial.op in REDUCTIONS:
        return trial.op, {"dim": "time"} | ({"q": 0.9} if trial.op == "quantile" else {})
    if trial.op.startswith("gst3d-"):
        return "gst3d", {"kernel": trial.op.split("-", 1)[1]}
    if trial.op == "svd-exact":
        return "svd", {"sample_dims": "time", "method": "exact"}
    if trial.op == "svd-compressed":
        # the same work as Dask's call below (its default, 2 passes over the input), not
        # memchunk's more accurate default of 2 power iterations (6 passes)
        return "svd", {"sample_dims": "time", "method": "compressed", "k": 10, "n_power_iter": 0}
    return trial.op, {}


def dask_call(trial: Trial, x: xr.DataArray) -> Any:
    """The lazy result a Dask user writes for the trial's work, on the input's own chunks."""
    import dask.array

    from xarray_memchunk.demo.seed_gst3d import SEED_DEPTH, seed_gst3d_dip
    from xarray_memchunk.operators.gst3d.kernels import gst3d_block, halo_depth
    from xarray_memchunk.operators.laplacian import laplacian_on_axes

    from .climate_functions import FUNCTIONS
    from .trial_functions import temporaries

    op = trial.op
    # xarray needs time in one chunk for a median or a quantile: the user asks for it
    if op in ("median", "quantile") and len(x.chunksizes["time"]) > 1:
        x = x.chunk({"time": -1} | {d: "auto" for d in x.dims if d != "time"})
    if op == "anomaly-p90":  # flox's quantile per group, too: the user rechunks the anomalies
        deviation = x.groupby("time.month") - x.groupby("time.month").mean()
        deviation = deviation.chunk({"time": -1} | {d: "auto" for d in x.dims if d != "time"})
        return deviation.groupby("time.month").quantile(0.9)
    if op in ("median", "quantile"):
        return x.median("time") if op == "median" else x.quantile(0.9, "time")
    if op in REDUCTIONS:
        return getattr(x, op)("time")
    if op.startswith("gst3d-"):
        kernel = op.split("-", 1)[1]
        depth = halo_depth(kernel, 1.0, 2.0, 3.0)
        return x.data.map_overlap(
            gst3d_block, depth=depth, boundary="none", dtype="float32", kernel=kernel
        )
    if op == "seed-gst3d":
        return x.data.map_overlap(
            seed_gst3d_dip, depth=SEED_DEPTH, boundary="none", dtype="float32"
        )
    if op == "laplacian":
        return x.data.map_overlap(
            laplacian_on_axes, depth={1: 1, 2: 1}, boundary="none", axes=(1, 2)
        )
    # U, S and V, as memchunk's result: asking for S alone lets Dask skip U's pass (and, for
    # tsqr, holding Q), work that memchunk's side does
    if op == "svd-exact":  # tsqr needs one chunk across the columns
        return sum_in_float64(dask.array.linalg.svd(x.data.rechunk({0: "auto", 1: -1})))
    if op == "svd-compressed":
        return sum_in_float64(dask.array.linalg.svd_compressed(x.data, 10, seed=0))
    if op == "temporaries":
        return x.data.map_blocks(temporaries)
    return FUNCTIONS[op](x)


def _total(result: Any) -> Any:
    """The sum of every output, as a lazy Dask scalar (nothing large comes to the client)."""
    if isinstance(result, xr.DataArray | xr.Dataset):
        return _consume(result)
    return result.sum(dtype="float64")


@dataclass
class Side:
    """What one side did."""

    outcome: str = ""
    error: str = ""
    seconds: float = 0.0
    plan_seconds: float = 0.0
    pauses: int = 0
    deaths: int = 0
    peak_worker: int = 0
    plan_peak_worker: int = 0
    chunks: str = ""
    predicted_worker: int = 0
    binding: str = ""
    minimum_limit: str = ""
    rerun: dict[str, Any] = field(default_factory=dict)
    total: float | None = None


#: ``give each worker at least 1.23 GiB (memory_limit)``: the least a refusal states.
_MINIMUM = re.compile(r"at least ([0-9.]+ ?[KMGT]i?B) \(memory_limit\)")


def stated_minimum(message: str) -> str:
    """The least ``memory_limit`` a refusal states: its first, which leads a plan's refusal."""
    found = _MINIMUM.search(message)
    return found[1] if found else ""


def _timeout(trial: Trial) -> float:
    """Seconds after which a side with no result is called hung."""
    heavy = 4.0 if trial.op in ("seed-gst3d", "gst3d-gaussian") else 1.0
    return 120 + 150 * heavy * trial.nbytes / 1e9


def _outcome(outcome: RunOutcome) -> str:
    if outcome.completed:
        return "completed"
    if outcome.error.startswith("KilledWorker"):
        return "killed"
    if outcome.error.startswith("TimeoutError"):
        return "hung"
    if outcome.error.startswith("InfeasiblePlanError"):
        return "refused"
    return "error"


def run_side(trial: Trial, side: str, x: xr.DataArray, memory_limit: str | None = None) -> Side:
    """Run one side on a fresh ``LocalCluster`` of the trial's layout, watched.

    Two phases, each watched: building the lazy result (for memchunk: planning, which measures
    a function it has not seen on the cluster's workers), then computing it. Pauses and deaths
    count in both; ``peak_worker`` is the computation's, ``plan_peak_worker`` the planning's.
    """
    record = Side()
    limit = memory_limit or trial.memory_limit
    built: list[Any] = []

    def build() -> None:
        if side == "dask":
            built.append(_total(dask_call(trial, x)))
            record.chunks = " x ".join(str(max(c)) for c in x.data.chunks)
            return
        op, kwargs = _memchunk_call(trial)
        try:
            plan = x.memchunk.plan(op, **kwargs)
        except InfeasiblePlanError as exc:
            record.error = str(exc)
            if exc.minimum_memory_limit:
                record.minimum_limit = format_size_up(exc.minimum_memory_limit)
            raise
        record.chunks = " x ".join(str(n) for n in plan.chunks.values())
        record.binding = str(plan.binding)
        # a staged plan's writes run before its tasks: the larger phase
        per_task = max(plan.predicted_peak_bytes, plan.staging_task_bytes)
        record.predicted_worker = plan.budget.worker_baseline + per_task * trial.threads
        built.append(_total(plan.apply()))

    def compute() -> None:
        record.total = float(built[0].compute())

    with fresh_client(trial.n_workers, trial.threads, limit) as client:
        client.run(lambda: __import__("xarray_memchunk"))
        seconds = _timeout(trial)
        planned = watch(client, side, lambda: within(seconds, build))
        ran = watch(client, side, lambda: within(seconds, compute)) if planned.completed else None
    outcome = ran or planned
    record.outcome = _outcome(outcome)
    record.error = "" if outcome.completed else (record.error or outcome.error)[:2000]
    record.plan_seconds = round(planned.seconds, 2)
    record.seconds = round(planned.seconds + (ran.seconds if ran else 0.0), 2)
    record.pauses = planned.pauses + (ran.pauses if ran else 0)
    record.deaths = planned.worker_deaths + (ran.worker_deaths if ran else 0)
    record.plan_peak_worker = planned.peak_bytes
    record.peak_worker = ran.peak_bytes if ran else 0
    return record


def _refusal(trial: Trial, x: xr.DataArray, memchunk: Side) -> None:
    """A refusal's stated minimum, and what happened when run again at it (in place)."""
    memchunk.minimum_limit = memchunk.minimum_limit or stated_minimum(memchunk.error)
    if not memchunk.minimum_limit:
        return
    needed = to_bytes(memchunk.minimum_limit)
    if needed * trial.n_workers > 18 * 2**30:  # more than this machine has for workers
        memchunk.rerun = {"outcome": "not run: above this machine's memory"}
        return
    limit = f"{math.ceil(needed / 1e7) / 100:.2f}GB"  # rounded up to 10 MB
    again = run_side(trial, "memchunk", x, memory_limit=limit)
    memchunk.rerun = {"memory_limit": limit} | {
        k: v for k, v in asdict(again).items() if k not in ("rerun", "minimum_limit")
    }


def run_trial(trial: Trial, sides_to_run: Sequence[str] = SIDES) -> dict[str, Any]:
    """Write the trial's input, run its sides (both by default, alternating order), return its
    record.
    """
    from . import trial_functions  # noqa: F401  (registers the user functions)
    from .climate_functions import FUNCTIONS  # noqa: F401  (registers the xarray expressions)

    for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    sides: dict[str, Side] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memchunk-trial-") as root:
        x = _input(_as_case(trial), Path(root))
        prepared = time.perf_counter() - started
        order = SIDES if trial.first == "dask" else SIDES[::-1]
        for side in (s for s in order if s in sides_to_run):
            sides[side] = run_side(trial, side, x)
        if "memchunk" in sides and sides["memchunk"].outcome == "refused":
            _refusal(trial, x, sides["memchunk"])
    return {
        **asdict(trial),
        "nbytes": trial.nbytes,
        "first": trial.first,
        "input_seconds": round(prepared, 1),
        **{side: asdict(record) for side, record in sides.items()},
    }


def _as_case(trial: Trial) -> SafetyCase:
    """The trial's input as the plan-safety harness builds it (its sources, its files)."""
    return SafetyCase(
        trial.op,
        trial.dtype,
        trial.shape,
        trial.chunks,
        trial.source,
        dates=trial.family == "cube",
    )

"""Self-calibration: measure a user's function on growing blocks, fit its memory model, save it.

A function with no memory model (a plain NumPy function, an xarray expression) is measured
the first time it is planned: :func:`self_calibrate` runs it on blocks of growing size in a
worker (or a child process), fits a linear model of its peak memory per task, and saves the
calibration as JSON beside the others, within a time bound (:data:`DEFAULT_SECONDS`). The
profiling and fitting it shares with :func:`~xarray_memchunk.measure.calibrate.calibrate`
live in :mod:`.calibrate`.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MeasuringWorkerDiedError
from ..models.calibration import load_calibration, save_calibration, writable_calibration_dir
from ..models.fitting import (
    ABSOLUTE_SLACK,
    UNDER_TOLERANCE,
    import_fitting_in_background,
)
from ..models.profiling import (
    TaskProfile,
    frozen_heap,
    measures_here,
    measuring_worker,
    peak_method,
    profile_in_worker,
)
from ..operators import DimUse, Operator
from ..planning.problem import DimRole
from ..units import format_size
from .calibrate import (
    EXTRAPOLATION,
    SAMPLE_BYTES,
    calibration_metadata,
    features_of,
    fit_profiles,
    fit_record,
    measures_in_cluster,
    padded_block,
    profiling_client,
    run_task,
    value_sample,
)

__all__ = [
    "SelfCalibration",
    "excess_over_linear",
    "growing_shapes",
    "halved_shapes",
    "self_calibrate",
    "superlinear_dims",
]

#: Seconds self-calibration takes at most, by default.
DEFAULT_SECONDS = 3.0
#: A largest block that ran shorter than this (seconds) is grown past the default time bound,
#: up to :data:`MAX_SECONDS`.
MIN_LARGEST_TASK_SECONDS = 0.5
#: Seconds self-calibration may take where its blocks ran too short to stop at.
MAX_SECONDS = 10.0
#: Share of the work it plans (the function's measured seconds per element over the whole
#: array) that self-calibration may take past its default bound, measuring larger blocks: a
#: plan stays within twice the largest, and a stencil's tasks that small recompute their halo
#: over and over (the seed's GST3D, halo 10, on 776 x 731 x 731 under the 3 s bound: tasks of
#: 60 x 74 x 49 voxels padded to 80 x 94 x 69, 42% of each task its own).
WORK_SHARE = 0.01
#: Seconds self-calibration may take at most under :data:`WORK_SHARE`.
MAX_WORK_SECONDS = 30.0
#: Share of a stencil's padded task that is its own voxels, not its neighbours' halo, that the
#: range self-calibration measures should allow: below it, most of each task's work is halo
#: recomputed. The seed's GST3D (halo 10) ran past its time limit in three trials on tasks 32%
#: to 42% their own, held there by the measured range; with a range for half, trial 466 (1.5 GB,
#: 2 workers x 1 thread, 2.5 GB each) planned tasks 48% their own, with memory for larger ones,
#: and at 2.3 us per padded voxel needed ~900 s of its 1019 s limit for the compute alone.
OWN_SHARE = 2 / 3
#: Share of the work it plans that self-calibration may take, where its blocks are still too
#: small for a range that allows tasks :data:`OWN_SHARE` their own (at most
#: :data:`MAX_WORK_SECONDS`).
HALO_WORK_SHARE = 0.05


@dataclass(frozen=True)
class SelfCalibration:
    """What :func:`self_calibrate` measured and saved.

    Attributes
    ----------
    path
        The calibration file written.
    n_profiles
        Block shapes measured.
    largest_elements
        Elements of the largest block measured.
    trusted_elements
        Largest task plans may reach (:func:`trusted_range`).
    seconds
        Wall time of the whole calibration (a profiling worker started included).
    median_abs_pct_error, worst_under_pct
        The fit's errors on the measured blocks, percent.
    squared_dims
        Dims along which memory grew faster than the block (see :func:`superlinear_dims`).
    measured_in
        The process the blocks ran in: a cluster's worker, or a child process of this one
        (no cluster, or an adaptive one with no worker running).
    dtype
        The data type measured: a Dataset of float32 and float64 variables is measured once
        for each, in one file.
    """

    path: Path
    n_profiles: int
    largest_elements: int
    trusted_elements: int
    seconds: float
    median_abs_pct_error: float
    worst_under_pct: float
    squared_dims: tuple[str, ...] = ()
    measured_in: str = "a worker process"
    dtype: str = ""

    def _within(self) -> str:
        """Where the worst under-prediction is large, that it is within the fit's allowance.

        The fit leaves a block at most :data:`UNDER_TOLERANCE` of it and
        :data:`ABSOLUTE_SLACK` below its measurement: on a block of a few MiB, that is a large
        share (a new user read "worst under-prediction 55.6%" as a model that failed).
        """
        if self.worst_under_pct <= 100 * UNDER_TOLERANCE:
            return ""
        return (
            f" (on a small block: within the {100 * UNDER_TOLERANCE:.0f}% + "
            f"{format_size(ABSOLUTE_SLACK)} per block the fit allows)"
        )

    def explain(self) -> str:
        """One sentence for the plan's notes."""
        text = (
            f"memory model calibrated now (the plan ran the operator"
            f"{f', on {self.dtype} data' if self.dtype else ''}): {self.n_profiles} "
            f"blocks measured in {self.measured_in}, up to {self.largest_elements:,} elements, in "
            f"{self.seconds:.1f} s; median |error| {self.median_abs_pct_error:.1f}%, worst "
            f"under-prediction {self.worst_under_pct:.1f}%{self._within()}; trusted up to "
            f"{self.trusted_elements:,} elements; saved as {self.path.name}"
        )
        if self.squared_dims:
            text += (
                f"; memory grows faster than the block along {', '.join(self.squared_dims)}: "
                f"modelled with their squared extents, not extrapolated along them"
            )
        return text


def growing_shapes(
    sizes: Mapping[str, int], whole: Sequence[str], start: int = 2**16
) -> Iterator[dict[str, int]]:
    """Blocks of the array's own proportions, doubling in elements from ``start``.

    ``whole`` dims keep their full length (the operator needs them whole); the others grow
    together until they reach the array's size.
    """
    fixed = math.prod(sizes[d] for d in whole)
    free = [d for d in sizes if d not in whole]
    span = math.prod(sizes[d] for d in free)
    target = max(start, fixed)
    while True:
        factor = min(1.0, (target / fixed / span) ** (1 / len(free))) if free else 1.0
        extents = {
            d: sizes[d] if d in whole else max(1, min(sizes[d], round(sizes[d] * factor)))
            for d in sizes
        }
        yield extents
        if all(extents[d] == sizes[d] for d in free):
            return
        target *= 2


def own_share_elements(
    sizes: Mapping[str, int], whole: Sequence[str], uses: Mapping[str, DimUse]
) -> int:
    """Padded elements of the first task, doubling, that is :data:`OWN_SHARE` its own voxels.

    Tasks double in the array's proportions from :data:`WARM_UP_ELEMENTS`
    (:func:`growing_shapes`), each padded as the planner pads the middle task of its dim
    (:func:`~xarray_memchunk.planning.candidates.padded_extent`), so the whole array, the
    last, is all its own. 0 without halo dims: nothing to aim for.
    """
    halos = {d: u.depth for d, u in uses.items() if u.role is DimRole.HALO and d in sizes}
    if not any(halos.values()):
        return 0
    for extents in growing_shapes(sizes, whole, start=WARM_UP_ELEMENTS):
        padded = padded_block(extents, sizes, halos)
        if math.prod(extents.values()) >= OWN_SHARE * math.prod(padded.values()):
            break
    return math.prod(padded.values())


def self_calibrate(
    operator: Operator,
    da: Any,
    kwargs: Mapping[str, Any],
    per_task: int,
    *,
    client=None,
    seconds: float | None = None,
    directory: str | os.PathLike | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> SelfCalibration:
    """Measure ``operator`` on blocks of ``da``'s dims and dtype, fit, and save.

    Each block runs as one task, in the active cluster's worker or, without one, in a child
    process (:class:`~xarray_memchunk.models.probe_process.ProbeProcess`: the user's script is
    not imported again), kept for the next calibration; in the child process too where the
    first block might not fit the worker (:func:`_first_block_too_large`). A small block runs
    first, unmeasured (:data:`WARM_UP_ELEMENTS`: a process's first run of a function pays for
    its imports). Blocks of the array's proportions double in size
    until a time bound or until the next would need more than one task's budget
    (``per_task``, extrapolated from the blocks before it; at most what the measuring worker
    has room for: :func:`_room_in`); at least three are measured. Where
    a block and the next would both run too short to stop at
    (:data:`MIN_LARGEST_TASK_SECONDS`) and the one after would not, the next is skipped
    (:func:`_step`). Then the block before the largest is measured again halved along each
    dim the plan may cut (each a quarter of the largest where the blocks doubled, an eighth
    where one was skipped), and the largest is cut into the trees of chunks the operator names
    (:meth:`~xarray_memchunk.Operator.tree_shapes`), whose combine tasks hold
    partial results: where memory falls faster than the block along a dim (``b.T @ b`` keeps
    ``extent**2`` of it), the linear form in the block's bytes cannot explain it, and the
    dim's squared extent becomes a feature, not extrapolated past what was measured
    (:func:`superlinear_dims`). The fit is
    :func:`~xarray_memchunk.models.fitting.fit_linear`'s, and records how far plans may go
    (:func:`trusted_range`).

    The time bound holds what is measured after the largest block. Under the default bound,
    where the largest block measured ran shorter than :data:`MIN_LARGEST_TASK_SECONDS`, blocks
    keep growing up to :data:`MAX_SECONDS`: plans go up to twice the largest block, and tasks
    much shorter than a second spend their time on Dask's per-task overhead and halos. Where
    the work planned is long, the default bound grows to :data:`WORK_SHARE` of it (at most
    :data:`MAX_WORK_SECONDS`): larger blocks measured widen the range plans may use. For a
    stencil, until the range allows tasks :data:`OWN_SHARE` their own voxels
    (:func:`own_share_elements`), it grows to :data:`HALO_WORK_SHARE` of the work.

    Parameters
    ----------
    seconds
        Time bound; the dask config key ``memchunk.self-calibration-seconds``, else
        :data:`DEFAULT_SECONDS`. A bound given either way is kept to.
    meanwhile
        Called in a thread of this process while another process starts and measures the
        blocks: a child process spends 1-2 s on its imports, and a kept one none, which
        planning spends measuring the input's production
        (:func:`~xarray_memchunk.operators.production.input_production`) on another core.
        Where the blocks run in this process (a cluster of threads here), it is called first,
        alone: a block's measurement would reset the high-water mark it reads; and where a
        block's request, pickled here, is over :data:`QUIET_BYTES`, the blocks wait for it.
        What of it does not overlap the blocks is not counted against the bound, nor in the
        calibration's seconds.

    Raises
    ------
    CalibrationError
        When the calibration directory cannot be written (checked before measuring), or the
        function fails on a block.
    """
    import dask

    from ..clusters import active_client

    start = time.perf_counter()
    target = writable_calibration_dir(directory)
    given = seconds or dask.config.get("memchunk.self-calibration-seconds", None)
    limit = float(given or DEFAULT_SECONDS)
    max_limit = limit if given else MAX_SECONDS  # a bound given is kept to
    dtype = np.dtype(da.dtype).name
    uses, key = operator.dims(da, **kwargs), operator.cost(da, **kwargs).calibration_key
    sizes = {str(d): int(n) for d, n in da.sizes.items()}
    whole = [d for d, u in uses.items() if u.role is DimRole.WHOLE]
    # the smallest block whose range (twice it, where memory grew linearly) allows a
    # stencil's tasks their own share
    halo_block = own_share_elements(sizes, whole, uses) / EXTRAPOLATION

    # the data's own coordinates: a function of dates (a climatology) finds them
    coords = {str(k): (tuple(map(str, v.dims)), np.asarray(v.values)) for k, v in da.coords.items()}
    runner = functools.partial(run_task, coords=coords)  # the data's values join it below

    def measure(
        extents: Mapping[str, int], repeats: int = 1, array: Mapping[str, int] | None = None
    ) -> list[TaskProfile]:
        array = array or extents
        case = (extents, array, (operator, dict(kwargs), extents, array, dtype))
        return profile_in_worker(profiler, runner, [case], dtype, repeats=repeats)

    def halves(block: TaskProfile) -> dict[str, TaskProfile]:
        return {d: measure(shape)[0] for d, shape in halved_shapes(block.extents, whole).items()}

    profiles: list[TaskProfile] = []
    over_budget: float | None = None  # the next block's peak, where it stopped the growth
    whole_array: int | None = None  # the array's elements, where the blocks grew to all of it
    beside: Future | None = None  # `meanwhile` in a thread of this process
    quiet = True  # the blocks may run while it does
    shapes = _distinct(growing_shapes(sizes, whole))
    chosen = client or active_client()
    too_large = _first_block_too_large(chosen, math.prod(shapes[0].values()) * da.dtype.itemsize)
    with (
        profiling_client(None if too_large else chosen, keep=True) as profiler,
        ThreadPoolExecutor(1, thread_name_prefix="memchunk-meanwhile") as thread,
    ):
        here = measures_here(profiler)
        measured_in = _measured_in(profiler, here) + too_large
        # a cluster's worker process starts on its imports with the first call it is sent (a
        # probe process started on them already); not a worker in this process
        first = None if here or not hasattr(profiler, "ncores") else _readiness(profiler)
        # the blocks hold the data's own values: a function whose memory depends on them (the
        # points below zero) is measured on values like those it runs on
        sampled: Future | None = None
        if here:  # its runs reset the high-water mark `meanwhile` reads: `meanwhile` first,
            began = time.perf_counter()  # alone, and not on the calibration's clock
            if meanwhile is not None:
                meanwhile()
            start += time.perf_counter() - began
            runner = functools.partial(runner, values=value_sample(da))
        else:  # while another process starts: the values are read, `meanwhile` measures, then
            # scikit-learn is imported (the fit below waits for it). A block's request is made
            # and freed here: a large one (big coordinates, a function holding data) would blur
            # the peak `meanwhile` measures here, and waits for it
            request = _request_bytes(runner, operator, kwargs) + SAMPLE_BYTES
            quiet = meanwhile is None or request <= QUIET_BYTES
            sampled = thread.submit(value_sample, da)
            beside = thread.submit(_then_import_fitting, meanwhile)
        method = (first if first is not None else _readiness(profiler)).result()
        if sampled is not None:
            runner = functools.partial(runner, values=sampled.result())
        if beside is not None and not quiet:
            start += _waited_for(beside)
        with frozen_heap(profiler) as held:  # each block's collection walks only what is newer
            # a fresh process's first run pays extra: a small block takes it, else the first
            # block runs three times (the median kept)
            first_runs = 1 if _warmed_up(measure, sizes, whole) else 3
            index = 0
            while True:
                extents = shapes[index]
                runs, started = 1 if profiles else first_runs, time.perf_counter()
                profiles += measure(extents, repeats=runs)
                now = time.perf_counter()
                if index == len(shapes) - 1:  # the whole array: no larger block
                    whole_array = math.prod(sizes.values())
                    break
                overhead = max(0.0, (now - started) / runs - profiles[-1].seconds)
                bound = limit if given else max(limit, _work_bound(profiles[-1], sizes))
                if not given and math.prod(extents.values()) < halo_block:
                    bound = max(bound, _work_bound(profiles[-1], sizes, HALO_WORK_SHARE))
                if profiles[-1].seconds < MIN_LARGEST_TASK_SECONDS:  # too short a task to stop at
                    bound = max(bound, max_limit)
                # the next block, or the one after it where the next would also run too short
                # to stop at (`_step`) and time and budget hold it; its peak is extrapolated
                # from the last two blocks' growth (at least in proportion): a function whose
                # memory grows faster than its block stops in time
                # no more than the measuring worker has room for now (a larger budget's plan)
                most = min(per_task, _room_in(profiler))
                for step in sorted({_step(profiles), 2.0}, reverse=True):  # the larger first
                    following = min(index + round(math.log2(step)), len(shapes) - 1)
                    growth = math.prod(shapes[following].values()) / math.prod(extents.values())
                    after = _after(operator, kwargs, extents, whole, growth)
                    grow = _grow(profiles, bound - (now - start), after, overhead, growth)
                    next_peak = _next_peak(profiles, growth)
                    if grow and next_peak <= most:
                        break
                if next_peak > most:
                    # the range stops at this budget's blocks, where a larger one is left: a
                    # larger budget measures again, also where time would have stopped here (a
                    # busy machine's blocks run slower; trial 548's re-run at its stated
                    # minimum, held to this range, ran tasks 26% their own past its limit)
                    over_budget = next_peak
                    break
                if not grow:
                    break
                index = following
            if beside is not None:  # the fit of the halved blocks imports scikit-learn
                start += _waited_for(beside)
            largest = profiles[-1].extents
            # the block before the largest, halved: each a quarter of the largest, or an eighth
            # where a block was skipped (halving the largest took twice as long: the seed's
            # GST3D, 1.17 s of a 2.8 s plan); where one is above the linear form by no more
            # than noise, the largest is halved instead
            source = profiles[-2] if len(profiles) > 1 else profiles[-1]
            halved = halves(source)
            excess = excess_over_linear(operator, kwargs, profiles, halved).values()
            if source is not profiles[-1] and any(0 < e <= ABSOLUTE_SLACK for e in excess):
                source = profiles[-1]
                halved = halves(source)
            trees = [
                measure(extents, array=array)[0]
                for extents, array in operator.tree_shapes(largest, **kwargs)
            ]
    squared = superlinear_dims(operator, kwargs, profiles, halved, source)
    everything = [*profiles, *halved.values(), *trees]
    record = fit_record(
        operator,
        everything,
        kwargs,
        measured_range=True,
        squared_dims=squared,
        resident=_largest_rise((held.before, held.after), key, dtype, operator.name),
        next_peak=over_budget,
        whole_array=whole_array,
    )
    path = save_calibration(
        key,
        "cpu",
        {dtype: record},
        calibration_metadata(method, kwargs, self_calibrated=True),
        target,
    )
    stats = record["fit"]
    return SelfCalibration(
        path=path,
        n_profiles=len(everything),
        largest_elements=max(math.prod(p.extents.values()) for p in profiles),
        trusted_elements=int(stats["max_task_elements"]),
        seconds=time.perf_counter() - start,
        median_abs_pct_error=stats["median_abs_pct_error"],
        worst_under_pct=stats["worst_under_pct"],
        squared_dims=tuple(squared),
        measured_in=measured_in,
        dtype=dtype,
    )


#: The largest rise of a measuring process's memory each operator's runs made in this Python
#: process's calibrations, by operator name (a groupby's methods are one operator).
_LARGEST_RISES: dict[str, int] = {}


def _largest_rise(
    resident: tuple[int, int], key: str, dtype: str, operator: str
) -> tuple[int, int]:
    """``resident`` (before, after the runs), or what rose more: the same operator before.

    Each read after a full collection. A measuring process that had run the operator, or
    another way of it, already rises by little:
    - measured again (on larger blocks, for a larger budget), a resample calibrated in a fresh
      process by 100.6 MB rose by 0.3 MB; the next plan counted the configured baseline alone,
      and its stated minimum was refused again on a new cluster;
    - a groupby's ``method="map-reduce"`` rose by 85.4 MiB importing flox's numba kernels, then
      ``"blockwise"``, in a worker that had imported them, by 13.6 MiB: a plan with no worker
      yet (an adaptive cluster at zero) counted that, and its run peaked at 0.99 of the pause
      line.
    So the rise kept is the largest of this one, the calibration's before it, and the
    operator's other calibrations in this process (returned on top of ``resident``'s before).
    """
    before, after = resident
    rises = [after - before, _LARGEST_RISES.get(operator, 0)]
    _LARGEST_RISES[operator] = max(rises)
    previous = load_calibration(key, "cpu", dtype)
    earlier = None if previous is None else previous.held_after_running(0)
    largest = max(rises if earlier is None else [*rises, earlier])
    return resident if largest <= after - before else (before, before + largest)


#: What a function's first block may hold per byte of its input, where it was never measured:
#: a block whose input times this is more than the measuring worker has room for is measured in
#: a child process instead (:func:`_first_block_too_large`). A plain NumPy function's
#: temporaries hold about 240 B per float32 voxel, 60 times its input.
UNMEASURED_PEAK_RATIO = 64


def _first_block_too_large(client, first_block_bytes: int) -> str:
    """Why the first block is measured in a child process, not ``client``'s worker; or ``""``.

    Nothing says what a function never measured needs before its first block runs, and the
    smallest block is the array whole along the dims the function needs whole: a new user's
    function of whole 2000 x 2000 planes (16 MB of float32 input each, about 180 MiB to compute)
    paused workers of 300 MB 5 times and killed 4 before its plan refused. Where the block's
    input times :data:`UNMEASURED_PEAK_RATIO` is more than the measuring worker has room for
    (:func:`_room_in`), a child process of this one measures, which no worker's limit holds.
    """
    if not hasattr(client, "ncores") or not measures_in_cluster(client):
        return ""
    room = _room_in(client)
    if first_block_bytes * UNMEASURED_PEAK_RATIO <= room:
        return ""
    return (
        f" (its first block, {format_size(first_block_bytes)} of input, could need more than "
        f"the {format_size(room)} a worker has room for)"
    )


def _room_in(profiler) -> float:
    """What one block may hold in the cluster worker that measures it, in bytes (else inf).

    Its pause threshold less what its process holds now (what earlier blocks left grows it),
    asked before each larger block. Planning for more memory than the cluster has (the least
    ``memory_limit`` a refusal states is searched by planning there) asks for blocks as large
    as that budget's tasks: a new user's 500 MB workers were killed by blocks sized for
    315.8 MiB tasks. A child process of this one, or this process, has no limit of a worker's.
    """
    from ..clusters import memory_threshold

    if not hasattr(profiler, "ncores"):
        return math.inf
    address = measuring_worker(profiler)
    worker = profiler.scheduler_info(n_workers=-1)["workers"].get(address, {})
    limit = worker.get("memory_limit") or 0
    if not limit:
        return math.inf
    # its process now (what earlier blocks left grows it), not its last heartbeat's
    # (a worker that died meanwhile answers nothing: its next block says so)
    held = profiler.run(_process_memory, workers=[address], on_error="ignore").get(address, 0)
    return max(0.0, memory_threshold("pause", "terminate", otherwise=0.8) * limit - held)


def _process_memory() -> int:
    """The resident memory of the process it runs in, as distributed's memory monitor reads it."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def _measured_in(profiler, here: bool) -> str:
    """Where ``profiler`` runs the blocks, as the plan's note says it."""
    if here:
        return "this process (a worker of the cluster's threads)"
    if hasattr(profiler, "ncores"):
        return "a worker process of the cluster"
    return "a child process of this one"


#: Elements of the block run once, unmeasured, before the first measured one: a process's first
#: run of a function pays for its imports and first-use set-up (the seed's GST3D: 0.5 s against
#: 0.15 s on its first block).
WARM_UP_ELEMENTS = 2**12


def _warmed_up(
    measure: Callable[..., list[TaskProfile]], sizes: Mapping[str, int], whole: Sequence[str]
) -> bool:
    """Run the function once on a small block of the array's proportions, its result dropped.

    False where there is no block smaller than the first measured one (whole dims of 65536
    elements or more), or where the function fails on it (a function may need more than a
    few elements along a dim): the first measured block then pays the first run's extra, and
    is run three times.

    Raises
    ------
    MeasuringWorkerDiedError
        When the measuring process died on it: calibration stops there, as on any block.
    """
    small = next(growing_shapes(sizes, whole, start=WARM_UP_ELEMENTS))
    if small == next(growing_shapes(sizes, whole)):
        return False
    try:
        measure(small)
    except MeasuringWorkerDiedError:
        raise
    except Exception:  # the function's own failure: the first measured block runs three times
        return False
    return True


def halved_shapes(extents: Mapping[str, int], whole: Sequence[str]) -> dict[str, dict[str, int]]:
    """``extents`` halved along each dim a plan may cut (not ``whole``, longer than 1)."""
    return {
        d: dict(extents) | {d: -(-n // 2)} for d, n in extents.items() if d not in whole and n > 1
    }


#: How much more than the linear form predicts a halved block may measure before the form is
#: taken as unable to explain the function (beside the fit's own absolute slack).
SUPERLINEAR_TOLERANCE = 0.10
#: A halved block below half the whole block's memory by this fraction shows a cost that falls
#: faster than the block along the halved dim.
FALLING_TOLERANCE = 0.02


def superlinear_dims(
    operator: Operator,
    kwargs: Mapping[str, Any],
    grown: Sequence[TaskProfile],
    halved: Mapping[str, TaskProfile],
    halved_from: TaskProfile | None = None,
) -> list[str]:
    """Dims along which memory grows faster than the block, from blocks halved along each.

    The blocks grown in the array's proportions are fitted; a halved block measured above that
    fit (by :data:`SUPERLINEAR_TOLERANCE` and the fit's absolute slack:
    :func:`excess_over_linear`) shows a cost the linear form cannot explain. The dims to blame
    are those whose halving removed more than half of the memory of the block halved
    (``halved_from``, one of ``grown``; the largest when None): the cost falls faster than the
    block along them. Where none did, every halved dim is.
    """
    excess = excess_over_linear(operator, kwargs, grown, halved)
    if not any(e > ABSOLUTE_SLACK for e in excess.values()):
        return []
    half = (halved_from or grown[-1]).peak_bytes / 2
    falling = [d for d, p in halved.items() if p.peak_bytes < half * (1 - FALLING_TOLERANCE)]
    return falling or list(halved)


def excess_over_linear(
    operator: Operator,
    kwargs: Mapping[str, Any],
    grown: Sequence[TaskProfile],
    halved: Mapping[str, TaskProfile],
) -> dict[str, float]:
    """Bytes each halved block measured above the linear fit of ``grown``, tolerance added.

    The fit's prediction without the small blocks' lift, times 1 +
    :data:`SUPERLINEAR_TOLERANCE`. Above :data:`~xarray_memchunk.models.fitting.ABSOLUTE_SLACK`
    the linear form cannot explain the block (:func:`superlinear_dims`); between 0 and the
    slack it cannot be told from the measurement's noise at this size: a cost that grows
    faster than the block shows twice that excess on a block twice the size (the largest
    halved), where self-calibration measures it again.
    """
    if not halved:
        return {}
    fit = fit_profiles(operator, grown, kwargs).memory

    def predicted(profile: TaskProfile) -> float:  # the slope's, without the small blocks' lift
        row = features_of(operator, profile.extents, profile.dtype, kwargs, profile.sizes)
        return float(fit.predict({k: np.array([v]) for k, v in row.items()})[0]) - fit.lift

    return {d: p.peak_bytes - predicted(p) * (1 + SUPERLINEAR_TOLERANCE) for d, p in halved.items()}


def _work_bound(largest: TaskProfile, sizes: Mapping[str, int], share: float = WORK_SHARE) -> float:
    """Seconds calibration may take for the work it plans: ``share`` of it, capped.

    The work is the whole array at the largest block's seconds per element, on one thread.
    """
    elements = math.prod(largest.extents.values())
    work = largest.seconds / max(1, elements) * math.prod(sizes.values())
    return min(MAX_WORK_SECONDS, share * work)


def _after(
    operator: Operator,
    kwargs: Mapping[str, Any],
    extents: Mapping[str, int],
    whole: Sequence[str],
    step: float = 2.0,
) -> float:
    """What growing past a block of ``extents`` adds after the next, in units of the next.

    The next block has ``step`` times the elements. The halved blocks are of ``extents`` then
    (the block before the largest), each ``1 / (2 x step)`` of the next block (a quarter where
    the blocks double); each tree of chunks is as many blocks as the tree holds.
    """
    elements = math.prod(extents.values())
    trees = sum(
        math.prod(array.values()) / elements for _, array in operator.tree_shapes(extents, **kwargs)
    )
    return 0.5 / step * len(halved_shapes(extents, whole)) + trees


def _grow(
    profiles: Sequence[TaskProfile],
    seconds_left: float,
    after: float = 0.0,
    overhead: float = 0.0,
    step: float = 2.0,
) -> bool:
    """Whether the time left holds a block of ``step`` times the elements (three are measured).

    The time left must hold the next block and what is measured after the largest one
    (``after`` x it: :func:`_after`), each measurement with its ``overhead`` (seconds beyond
    the task, as the last one took), so that the whole calibration keeps to its bound. The
    next block's time grows as its peak (:func:`_growth`).
    """
    next_block = _growth(profiles, step) * profiles[-1].seconds + overhead
    return len(profiles) < 3 or next_block * (1.0 + after) < seconds_left


def _exponent(profiles: Sequence[TaskProfile]) -> float:
    """How the peak grew with the elements between the last two blocks: ``peak ~ elements**p``.

    At least 1 (no less than in proportion), and 1 with fewer than two blocks or no peak.
    """
    if len(profiles) < 2:
        return 1.0
    before, last = profiles[-2], profiles[-1]
    elements = math.prod(last.extents.values()) / math.prod(before.extents.values())
    if before.peak_bytes <= 0 or last.peak_bytes <= 0 or elements <= 1:
        return 1.0
    return max(1.0, math.log(last.peak_bytes / before.peak_bytes) / math.log(elements))


def _growth(profiles: Sequence[TaskProfile], step: float = 2.0) -> float:
    """How much the peak of a block of ``step`` times the last's elements grows over the last's.

    As between the last two blocks (:func:`_exponent`), at least in proportion.
    """
    return step ** _exponent(profiles)


def _next_peak(profiles: Sequence[TaskProfile], step: float = 2.0) -> float:
    """The peak of a block of ``step`` times the last's elements (:func:`_growth`)."""
    return _growth(profiles, step) * profiles[-1].peak_bytes


def _step(profiles: Sequence[TaskProfile]) -> float:
    """How many times the last block's elements the next block aims at: 2, or 4 to skip one.

    The blocks double, but where the last ran shorter than :data:`MIN_LARGEST_TASK_SECONDS`,
    a block twice it would too and one four times it would not, on the line through the last
    two blocks' seconds (:func:`_seconds_at`), the next is the one after: doubling would
    measure one more block too short to stop at (the seed's GST3D: 0.22 s on 132,651
    elements, then 0.44 s on 262,144, and 0.86 s on 531,441 to stop at). Only where both
    blocks measured a peak to extrapolate from. :func:`self_calibrate` doubles where the time
    left or the budget does not hold the block after next.
    """
    if len(profiles) < 2 or min(p.peak_bytes for p in profiles[-2:]) <= 0:
        return 2.0
    if profiles[-1].seconds >= MIN_LARGEST_TASK_SECONDS:
        return 2.0
    short = _seconds_at(2.0, profiles[-2:]) < MIN_LARGEST_TASK_SECONDS
    return 4.0 if short and _seconds_at(4.0, profiles[-2:]) >= MIN_LARGEST_TASK_SECONDS else 2.0


def _seconds_at(step: float, blocks: Sequence[TaskProfile]) -> float:
    """Seconds a block of ``step`` times the last of ``blocks``' elements runs.

    On the line through the two blocks' seconds against their elements (a task's fixed time,
    then its time per element); in proportion to the last block's where the line does not
    rise.
    """
    (before, last), sizes = blocks, [math.prod(b.extents.values()) for b in blocks]
    per_element = (last.seconds - before.seconds) / max(1, sizes[1] - sizes[0])
    if per_element <= 0:
        return step * last.seconds
    return last.seconds + per_element * (step - 1) * sizes[1]


def _distinct(shapes: Iterator[dict[str, int]]) -> list[dict[str, int]]:
    """``shapes`` without repeats: a short dim's rounding can leave a doubled block as it was."""
    kept: list[dict[str, int]] = []
    for shape in shapes:
        if not kept or shape != kept[-1]:
            kept.append(shape)
    return kept


def _readiness(profiler):
    """The measuring process's :func:`peak_method`, as a future (a probe process answers now).

    The first call a measuring process receives: a cluster's worker starts on its imports.
    """
    worker = measuring_worker(profiler)
    return profiler.submit(peak_method, pure=False, workers=[worker])


#: Bytes of a block's request (the measuring function, the operator, the data's coordinates)
#: up to which blocks are measured while ``meanwhile`` measures a peak in this process: a
#: request is pickled here for each block, a blur far below the fit's 4 MiB slack.
QUIET_BYTES = 2**20


def _request_bytes(*parts: object) -> int:
    """Bytes of ``parts`` pickled as a block's request to the measuring process pickles them."""
    import cloudpickle

    return len(cloudpickle.dumps(parts))


def _waited_for(future: Future) -> float:
    """Seconds spent waiting for ``future``'s result (its error raised): not the calibration's."""
    waited = time.perf_counter()
    future.result()
    return time.perf_counter() - waited


def _then_import_fitting(meanwhile: Callable[[], object] | None) -> None:
    """Call ``meanwhile``, then start importing scikit-learn: not beside a peak it measures."""
    if meanwhile is not None:
        meanwhile()
    import_fitting_in_background()

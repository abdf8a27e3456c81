"""Does a plan that says it fits run without a pause or a worker death? Measured, not modelled.

Each :class:`SafetyCase` builds its input as a user would (generated inside the Dask graph, or
written to a Zarr store and opened with ``xarray.open_zarr``), picks a worker memory limit at
which the plan is memory-bound (the plan's binding constraint is memory: larger chunks would
not fit), runs ``apply`` on a fresh ``LocalCluster`` with that limit, and records the plan's
prediction next to what the workers really did: peak RSS per worker, pauses, deaths.

``benchmarks/plan_safety.py`` runs the full matrix (every built-in operator, float32 and
float64, input from a graph and from Zarr; GST3D from SEG-Y too); ``tests/test_plan_safety.py``
runs a few cases of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import distributed  # noqa: F401  (its config loaded before any dask.config.set of its keys)
import numpy as np
import xarray as xr

from xarray_memchunk.errors import BudgetError, InfeasiblePlanError
from xarray_memchunk.testing import run_watched
from xarray_memchunk.units import to_bytes

__all__ = ["LIMITS", "SafetyCase", "SafetyResult", "format_table", "run_case"]

#: Worker memory limits tried, largest first: a case runs at the largest whose plan is bound
#: by memory.
LIMITS = ("3GB", "2GB", "1.5GB", "1.2GB", "1GB", "0.8GB", "0.6GB", "0.5GB", "0.4GB")


@dataclass(frozen=True)
class SafetyCase:
    """One operator on one input.

    Attributes
    ----------
    op, kwargs
        The operator and its arguments.
    dtype
        Input dtype.
    shape
        Dim name -> length.
    chunks
        Dim name -> chunk length of the input as it comes (storage chunks for a file).
    source
        ``"graph"``: random data generated inside the Dask graph; ``"preprocessed"``: float64
        normal data scaled, shifted and cast to ``dtype`` in the graph (preprocessing
        upstream); ``"file"``: the uniform data written to a Zarr store first and opened with
        ``xarray.open_zarr``; ``"netcdf"``: written to one netCDF file (storage chunks
        ``chunks``) and opened with ``xarray.open_dataset(..., chunks={})``;
        ``"mfdataset"``: written to 4 netCDF files split along the first dim (storage chunks
        ``chunks``) and opened with ``xarray.open_mfdataset``; ``"segy"``: written to a SEG-Y
        file (3-D, inline-sorted; float32 as IEEE, float64 as format 6) and opened with
        :func:`~xarray_memchunk.io.open_segy` (``chunks`` only shape the generation).
    memory_limit
        Worker memory limit; None picks the largest of :data:`LIMITS` whose plan is bound by
        memory.
    label
        Name shown in the table.
    kill_after
        Seconds into the run after which one worker is killed with SIGKILL (not for memory):
        the run must still complete, and the next plan must be the same.
    threads
        Threads per worker.
    deployment
        ``"local"``: a ``LocalCluster``; ``"adaptive"``: a ``LocalCluster`` of no worker that
        adapts up to the workers the case runs on; ``"processes"``: ``dask scheduler`` and
        ``dask worker`` started as separate processes, the client connected by address;
        ``"in-process"``: an adaptive ``LocalCluster(processes=False)`` of no worker, whose
        workers run in this process and pause on all it holds.
    dates
        Give ``time`` a daily calendar (from 2001-01-01) and ``lat`` degrees from -89.5 to
        89.5, as climate data has (climatologies need them); the result is also compared with
        the operator's function run by xarray, on a strip of the data.
    reference
        The computation as xarray runs it, for that comparison (a built-in operator's
        equivalent); the operator itself (a decorated function) when None.
    """

    op: str
    dtype: str
    shape: dict[str, int]
    chunks: dict[str, int]
    source: str = "graph"
    kwargs: dict[str, Any] = field(default_factory=dict)
    memory_limit: str | None = None
    label: str = ""
    kill_after: float | None = None
    threads: int = 1
    deployment: str = "local"
    dates: bool = False
    reference: Any = None

    @property
    def name(self) -> str:
        """The label, or the operator and its main argument."""
        if self.label:
            return self.label
        extra = self.kwargs.get("kernel") or self.kwargs.get("method") or ""
        return f"{self.op}{'-' + extra if extra else ''}"


@dataclass
class SafetyResult:
    """A case's plan and what happened when it ran."""

    case: SafetyCase
    memory_limit: str
    binding: str = ""
    chunks: dict[str, int] = field(default_factory=dict)
    n_chunks: int = 0
    predicted_task: int = 0
    predicted_slot: int = 0
    per_task_budget: int = 0
    worker_baseline: int = 0
    idle_worker: int = 0
    peak_worker: int = 0
    pauses: int = 0
    deaths: int = 0
    seconds: float = 0.0
    completed: bool = False
    error: str = ""
    learned: str = ""
    replanned_same: bool | None = None
    staged: bool = False
    equal: bool | None = None
    threads: int = 0  # the plan's threads per worker: all of them where workers run here

    @property
    def predicted_worker(self) -> int:
        """Baseline plus one predicted task slot per thread."""
        return self.worker_baseline + self.predicted_slot * (self.threads or self.case.threads)

    @property
    def safe(self) -> bool:
        """Completed with no pause and no worker death (but the one killed on purpose)."""
        on_purpose = 1 if self.case.kill_after is not None else 0
        return self.completed and self.pauses == 0 and self.deaths <= on_purpose


def _input(case: SafetyCase, root: Path) -> xr.DataArray:
    """The case's input: random data in the graph, or the same written to a file and opened."""
    import dask.array as da

    dims = list(case.shape)
    data = da.random.default_rng(0).random(
        tuple(case.shape[d] for d in dims),
        chunks=tuple(case.chunks[d] for d in dims),
        dtype=case.dtype,
    )
    array = xr.DataArray(data, dims=dims, name="v")
    if case.dates:
        import pandas as pd

        array = array.assign_coords(
            time=pd.date_range("2001-01-01", periods=case.shape["time"], freq="D"),
            lat=np.linspace(-89.5, 89.5, case.shape["lat"]),
        )
    if case.source == "graph":
        return array
    if case.source == "preprocessed":
        normal = da.random.default_rng(0).standard_normal(data.shape, chunks=data.chunks)
        return array.copy(data=(normal * 2.0 + 1.0).astype(case.dtype))
    if case.source == "mfdataset":
        return _files(array, case, root)
    if case.source == "netcdf":
        return _netcdf(array, case, root)
    if case.source == "segy":
        from xarray_memchunk.io import open_segy, write_segy

        path = root / f"{case.dtype}-{'x'.join(map(str, array.shape))}.sgy"
        if not path.exists():
            write_segy(array, path, sample_format=5 if case.dtype == "float32" else 6)
        return open_segy(path)
    layout = "-".join(f"{d}{case.shape[d]}c{case.chunks[d]}" for d in dims)
    path = root / f"{case.dtype}-{layout}.zarr"  # shared by the cases that read the same data
    if not path.exists():
        import dask

        with dask.config.set(scheduler="threads"):
            array.to_dataset().to_zarr(path, mode="w")
    return xr.open_zarr(path)["v"]


def _files(array: xr.DataArray, case: SafetyCase, root: Path) -> xr.DataArray:
    """``array`` written to 4 netCDF files along its first dim, opened with open_mfdataset.

    Each file's storage chunks are ``case.chunks``, cut to the file's own length.
    """
    import dask

    first = array.dims[0]
    layout = "-".join(f"{d}{case.shape[d]}c{case.chunks[d]}" for d in array.dims)
    paths = [root / f"{case.dtype}-{layout}-{i}.nc" for i in range(4)]
    if not all(p.exists() for p in paths):
        bounds = np.linspace(0, array.sizes[first], 5).astype(int)
        with dask.config.set(scheduler="threads"):
            for path, start, stop in zip(paths, bounds[:-1], bounds[1:], strict=True):
                piece = array.isel({first: slice(start, stop)}).to_dataset()
                lengths = {d: min(case.chunks[d], piece.sizes[d]) for d in array.dims}
                encoding = {"v": {"chunksizes": tuple(lengths.values())}}
                if first not in piece.coords:
                    piece = piece.assign_coords({first: np.arange(start, stop)})
                piece.to_netcdf(path, engine="netcdf4", encoding=encoding)
    opened = xr.open_mfdataset(paths, chunks={}, combine="by_coords", engine="netcdf4")
    return opened["v"]


def _netcdf(array: xr.DataArray, case: SafetyCase, root: Path) -> xr.DataArray:
    """``array`` written to one netCDF file in ``case.chunks``, opened with its own chunks."""
    import dask

    layout = "-".join(f"{d}{case.shape[d]}c{case.chunks[d]}" for d in array.dims)
    path = root / f"{case.dtype}-{layout}.nc"
    if not path.exists():
        encoding = {"v": {"chunksizes": tuple(case.chunks[d] for d in array.dims)}}
        with dask.config.set(scheduler="threads"):
            array.to_dataset().to_netcdf(path, engine="netcdf4", encoding=encoding)
    return xr.open_dataset(path, chunks={}, engine="netcdf4")["v"]


def _plan(case: SafetyCase, data: xr.DataArray, memory_limit: str | None, n_workers: int = 2):
    """The case's plan: for ``memory_limit`` (the case's cluster layout), or the active one."""
    from xarray_memchunk.memory_limits import machine_cores, make_budget

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if memory_limit is None:
            return data.memchunk.plan(case.op, **case.kwargs)
        budget = make_budget(  # a LocalCluster on this machine
            to_bytes(memory_limit), case.threads, n_workers, "the case", cores=machine_cores()
        )
        return data.memchunk.plan(case.op, budget=budget, **case.kwargs)


def choose_limit(case: SafetyCase, data: xr.DataArray, n_workers: int = 2) -> str:
    """The largest of :data:`LIMITS` whose plan is memory-bound (else the smallest feasible)."""
    feasible = []
    for limit in LIMITS:
        try:
            plan = _plan(case, data, limit, n_workers)
        except InfeasiblePlanError:
            continue
        if plan.binding == "memory":
            return limit
        feasible.append(limit)
    if not feasible:
        raise InfeasiblePlanError(f"{case.name}: no plan fits at any of {LIMITS}")
    return feasible[-1]


def stated_minimum(case: SafetyCase, n_workers: int = 2, below: str = "0.3GB") -> int:
    """The ``memory_limit`` that the refusal of ``case`` at ``below`` states (its cluster layout).

    Raises
    ------
    ValueError
        Where the plan at ``below`` is not refused with a stated minimum.
    """
    with tempfile.TemporaryDirectory() as tmp:
        data = _input(case, Path(tmp))
        try:
            _plan(case, data, below, n_workers)
        except InfeasiblePlanError as refused:
            if refused.minimum_memory_limit:
                return refused.minimum_memory_limit
    raise ValueError(f"{case.name}: a plan at {below} was not refused with a stated minimum")


def most_tasks_near_minimum(
    case: SafetyCase, n_workers: int = 2, above: float = 0.06, step: float = 0.0025
) -> int:
    """Of the limits from the stated minimum to ``above`` over it, the one planned in most tasks.

    Just above its minimum, only the plans that need least fit, which may be a great many
    small chunks: the plans most likely to hold what a model leaves out.
    """
    least = stated_minimum(case, n_workers)
    limits = [int(least * (1 + k * step)) for k in range(int(above / step) + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        data = _input(case, Path(tmp))
        tasks = {limit: _plan(case, data, str(limit), n_workers).n_chunks for limit in limits}
    return max(limits, key=lambda limit: tasks[limit])


def _consume(result: Any) -> Any:
    """The sum of every output, so that computing it gathers nothing large to the client.

    Each block is summed in float64 without a float64 copy of it (``sum(dtype=...)``, not
    ``astype``): the sum is fused into the task that makes the block, and a copy there would
    add twice a float32 block to a task the plan never saw (trial 249: 601 MB measured against
    505 MB predicted; the copy alone is one more block, measured in one process).
    """
    arrays = result.data_vars.values() if isinstance(result, xr.Dataset) else [result]
    return sum_in_float64([a.data for a in arrays])


def sum_in_float64(arrays: Sequence[Any]) -> Any:
    """The sum of Dask arrays, each summed in float64 without a copy: one lazy scalar."""
    import dask.array

    return dask.array.stack([a.sum(dtype="float64") for a in arrays]).sum()


def _process_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@contextlib.contextmanager
def _cluster(case: SafetyCase, limit: str, n_workers: int, root: Path) -> Iterator[Any]:
    """A client of the case's deployment, torn down afterwards."""
    from distributed import Client, LocalCluster

    if case.deployment == "processes":
        with _separate_processes(case, limit, n_workers, root) as address, Client(address) as c:
            c.wait_for_workers(n_workers, timeout=120)
            yield c
        return
    adaptive = case.deployment in ("adaptive", "in-process")
    with (
        LocalCluster(
            n_workers=0 if adaptive else n_workers,
            threads_per_worker=case.threads,
            memory_limit=limit,
            processes=case.deployment != "in-process",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        if adaptive:
            cluster.adapt(minimum=0, maximum=n_workers)
        yield client


@contextlib.contextmanager
def _separate_processes(case: SafetyCase, limit: str, n_workers: int, root: Path) -> Iterator[str]:
    """``dask scheduler`` and ``dask worker`` as processes of their own; the address."""
    import json
    import subprocess
    import sys

    scheduler_file = root / f"scheduler-{os.getpid()}-{time.monotonic_ns()}.json"
    dask_cli = (sys.executable, "-m", "dask")
    # the workers unpickle this module's functions (client.run): they must find ``harness``
    benchmarks = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (benchmarks, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    started = [
        subprocess.Popen(
            [
                *dask_cli,
                *("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
                *("--scheduler-file", str(scheduler_file)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not (scheduler_file.exists() and scheduler_file.stat().st_size):
            if time.monotonic() > deadline:
                raise RuntimeError("the dask scheduler did not start in 60 s")
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        started.append(
            subprocess.Popen(
                [
                    *dask_cli,
                    *("worker", address, "--nworkers", str(n_workers)),
                    *("--nthreads", str(case.threads), "--memory-limit", limit, "--no-dashboard"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        )
        yield address
    finally:
        for process in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def run_case(
    case: SafetyCase, root: Path | None = None, *, n_workers: int = 2, quiet: bool = True
) -> SafetyResult:
    """Plan ``case`` at its memory limit, run it on a fresh cluster, and measure.

    Parameters
    ----------
    case
        What to run.
    root
        Directory for file inputs (a temporary one by default).
    n_workers
        Workers of the cluster, ``case.threads`` threads each.
    quiet
        Silence the restart warnings distributed logs when a worker dies.
    """
    import dask

    if quiet:
        for name in ("distributed.nanny", "distributed.scheduler", "distributed.worker"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(root or tmp)
        data = _input(case, root)
        limit = case.memory_limit or choose_limit(case, data, n_workers)
        result = SafetyResult(case, limit)
        before = _plan(case, data, limit, n_workers)  # away from the cluster
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 1}),
            _cluster(case, limit, n_workers, root) as client,
        ):
            if case.deployment not in ("adaptive", "in-process"):
                client.run(lambda: __import__("xarray_memchunk"))
                time.sleep(0.5)  # let a heartbeat report the workers' memory after the import
            result.idle_worker = (
                _process_rss()  # its workers are this process, started or not
                if case.deployment == "in-process"
                else max(client.run(_process_rss).values(), default=0)
            )
            try:
                plan = _plan(case, data, None)
            except (InfeasiblePlanError, BudgetError) as exc:
                result.error = f"refused before running: {str(exc)[:150]}"
                return result
            result.binding = plan.binding
            result.chunks = dict(plan.chunks)
            result.n_chunks = plan.n_chunks
            result.predicted_task = plan.predicted_task_bytes
            result.predicted_slot = plan.predicted_peak_bytes
            result.per_task_budget = plan.budget.per_task
            result.worker_baseline = plan.budget.worker_baseline
            result.threads = plan.budget.threads_per_worker
            result.staged = any("temporary Zarr store" in n for n in plan.notes)

            def build() -> Any:
                return _consume(plan.apply())

            killer = None
            if case.kill_after is not None:  # built first: a kill during apply is not the test
                built = build()
                killer = _killer(client, case.kill_after)
                outcome = run_watched(client, case.name, lambda: built)
            else:  # a staged input is written inside the watch, by apply
                outcome = run_watched(client, case.name, build)
            if killer is not None:
                killer.cancel()
            if outcome.completed:
                result.learned = plan.report().learned
                if case.dates:
                    result.equal = _equal_to_xarray(case, data, plan)
        if outcome.completed:
            after = _plan(case, data, limit, n_workers)
            result.replanned_same = (
                after.predicted_task_bytes == before.predicted_task_bytes
                and after.dask_chunks == before.dask_chunks
            )
        result.peak_worker = outcome.peak_bytes
        result.pauses, result.deaths = outcome.pauses, outcome.worker_deaths
        result.seconds, result.completed, result.error = (
            outcome.seconds,
            outcome.completed,
            outcome.error,
        )
    return result


def _equal_to_xarray(case: SafetyCase, data: xr.DataArray, plan: Any) -> bool:
    """The plan's result on a strip of the data equals the operator's function run by xarray.

    The strip is the first 4 elements of a location dim: one the result keeps at its length
    (not a dim reduced, grouped or resampled) and without a halo (the function works on each
    of its elements apart), the last that the plan cuts, else the last; all of the data where
    there is none. The reference is computed in this process (threads), not on the case's
    cluster, whose workers are sized for the plan.
    """
    from xarray_memchunk.operators import get_operator

    func = case.reference or get_operator(case.op)
    result = plan.apply()
    sizes = result.sizes
    located = [d for d in data.dims if sizes.get(d) == data.sizes[d] and d not in plan.halo]
    cut = [d for d in located if plan.chunks.get(d, data.sizes[d]) < data.sizes[d]]
    strip = {(cut or located)[-1]: slice(0, 4)} if located else {}
    result = (result if isinstance(result, xr.DataArray) else result.to_array()).isel(strip)
    expected = func(data.isel(strip).compute(scheduler="threads"))
    expected = expected if isinstance(expected, xr.DataArray) else expected.to_array()
    computed = result.compute(scheduler="threads").values
    return bool(np.allclose(computed, expected.values, equal_nan=True, rtol=1e-5))


def _killer(client: Any, seconds: float | None) -> threading.Timer | None:
    """A timer that SIGKILLs the first worker's process ``seconds`` from now, or None."""
    if seconds is None:
        return None
    pid = next(iter(client.run(os.getpid).values()))
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGKILL))
    timer.start()
    return timer


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}"


def format_table(results: Sequence[SafetyResult]) -> str:
    """A Markdown table: one row per case, measured next to predicted."""
    header = (
        "| operator | dtype | input | shape | limit | binding | chunks | tasks | predicted "
        "task MB | predicted slot MB | worker baseline MB | predicted worker MB | measured "
        "worker peak MB | pause at MB | pauses | deaths | wall s | outcome | next plan |"
    )
    rows = [header, "| " + " | ".join(["---"] * (header.count("|") - 1)) + " |"]
    for r in results:
        c = r.case
        shape = "x".join(str(n) for n in c.shape.values())
        chunks = "x".join(str(n) for n in r.chunks.values())
        pause = 0.8 * to_bytes(r.memory_limit)
        outcome = "completed" if r.completed else (r.error.split(":")[0] or "failed")
        if r.equal is not None:
            outcome += ", equal to xarray's" if r.equal else ", NOT equal to xarray's"
        where = c.source + (", staged on disk" if r.staged else "")
        if c.threads > 1 or c.deployment != "local":
            where += f"; {c.deployment}, {c.threads} threads"
            if r.threads and r.threads != c.threads:
                where += f" (planned as {r.threads} per worker)"
        rows.append(
            f"| {c.name} | {c.dtype} | {where} | {shape} | {r.memory_limit} | {r.binding} | "
            f"{chunks} | {r.n_chunks} | {_mb(r.predicted_task)} | {_mb(r.predicted_slot)} | "
            f"{_mb(r.worker_baseline)} | {_mb(r.predicted_worker)} | {_mb(r.peak_worker)} | "
            f"{_mb(pause)} | {r.pauses} | {r.deaths} | {r.seconds:.1f} | {outcome} | "
            f"{_replanned(r)} |"
        )
    return "\n".join(rows)


def _replanned(result: SafetyResult) -> str:
    if result.replanned_same is None:
        return ""
    return "same" if result.replanned_same else "changed: " + result.learned[:60]


def summary(results: Sequence[SafetyResult]) -> str:
    """One line: how many plans ran safely, and the largest measured / predicted worker peak."""
    ran = [r for r in results if r.binding]
    safe = sum(r.safe for r in ran)
    ratios = [r.peak_worker / r.predicted_worker for r in ran if r.completed and r.predicted_worker]
    worst = f"{max(ratios):.2f}" if ratios else "n/a"
    memory_bound = sum(r.binding == "memory" for r in ran)
    replanned = [r for r in ran if r.replanned_same is not None]
    same = sum(bool(r.replanned_same) for r in replanned)
    compared = [r for r in ran if r.equal is not None]
    equal = (
        f"; results equal to xarray's in {sum(bool(r.equal) for r in compared)} of "
        f"{len(compared)} compared"
        if compared
        else ""
    )
    return (
        f"{safe} of {len(ran)} planned runs completed with 0 pauses and 0 deaths (a worker "
        f"killed on purpose not counted) "
        f"({memory_bound} memory-bound); largest measured / predicted worker peak: {worst}; "
        f"the next plan after the run was the same in {same} of {len(replanned)}{equal}"
    )

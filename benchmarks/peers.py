"""memchunk beside its peers: Dask's auto chunks and Cubed, the same work under the same memory.

    pip install -e ".[peers]"                  # cubed + cubed-xarray
    python benchmarks/peers.py                  # every row (climate rows too), median of 3
    python benchmarks/peers.py --only mean median quantile svd-exact svd-compressed gst3d \
        --timeout 120                           # the core rows: 43 min on 2 cores
    python benchmarks/peers.py --only mean svd-exact --repeats 1
    python benchmarks/peers.py --only mean gst3d --tools dask memchunk
    python benchmarks/peers.py --only clim-month anomaly monthly rolling-30 --out <file>
    python benchmarks/peers.py --only clim-doy area-mean trend anomaly-p90 --out <file>

The climate rows (issue 30) run xarray expressions on the cube: Dask's row is xarray with flox
(its groupby engine) and Dask's auto chunks, ``flox-cohorts`` the same with
``method="cohorts"`` (groupby rows), memchunk the same function decorated
(:mod:`harness.climate_functions`), but for the rows of :data:`BUILT_IN`, which memchunk
computes with its built-in operator: ``clim-month`` and ``clim-doy`` with ``groupby`` (flox's
method chosen with the chunks), ``monthly`` with ``resample`` (whole months per chunk, time cut
at month edges), ``rolling-30`` with ``rolling`` (a stencil along time). ``anomaly-p90``'s
Dask row rechunks the anomalies to whole time series, as flox's quantile asks.

Every tool gets 2 processes x 1 thread x ``--memory-limit``. Dask and memchunk run on a fresh
``LocalCluster`` with that ``memory_limit`` per run; Cubed runs on its ``processes`` executor
(``max_workers=2``), with ``Spec(allowed_mem=<the same limit>, reserved_mem=<measured by
cubed.measure_reserved_mem>)`` and its own chunks (the store's, through cubed-xarray). Cubed's
processes enforce no limit: its row reports whether the measured peak crossed it.

Peak memory is the largest RSS of any worker process, sampled every 20 ms from outside (psutil);
pauses and deaths come from the scheduler's event log (Dask and memchunk only). Cases run
interleaved (each repeat starts one tool later) and the median-time run is kept. Prints a
Markdown table and writes it to ``benchmarks/results/peers.md``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.array
import harness.climate_functions  # noqa: F401  (registers the climate rows' operators)
import numpy as np
import xarray as xr
from dask.utils import parse_bytes
from harness.fresh import fresh_client
from harness.timeouts import within

import xarray_memchunk  # the .memchunk accessor, and remove_staged_stores
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic
from xarray_memchunk.models.profiling import RssSampler
from xarray_memchunk.operators.gst3d.kernels import gst3d_block, halo_depth
from xarray_memchunk.testing import RunOutcome, watch

TOOLS = ("dask", "flox-cohorts", "cubed", "memchunk")
#: The xarray expressions (issue 30): row -> name in :mod:`harness.climate_functions`.
CLIMATE = {
    "clim-month": "clim-month",
    "clim-doy": "clim-doy",
    "anomaly": "anomaly",
    "monthly": "monthly",
    "rolling-30": "rolling-30",
    "area-mean": "area-mean",
    "trend": "trend",
    "anomaly-p90": "anomaly-p90",
}
#: Rows that memchunk computes with a built-in operator: row -> (operator, its arguments).
BUILT_IN = {
    "clim-month": ("groupby", {"by": "time.month"}),
    "clim-doy": ("groupby", {"by": "time.dayofyear"}),
    "monthly": ("resample", {"freq": "1MS"}),
    "rolling-30": ("rolling", {"dim": "time", "window": 30, "center": True}),
}
#: Rows with a groupby, where flox's method can be chosen.
GROUPED = ("clim-month", "clim-doy", "anomaly")
GST3D_HALO = halo_depth("gaussian", 1.0, 2.0, 3.0)
#: What a Cubed user states as ``extra_projected_mem`` for GST3D: bytes per padded voxel of
#: float32 work in the fused kernel (36 measured in a worker, rounded up).
GST3D_BYTES_PER_VOXEL = 40


@dataclass(frozen=True)
class Inputs:
    """Paths of the Zarr stores every tool reads."""

    cube: Path  # (time, lat, lon), one-day chunks
    tall: Path  # (time, space), tall and skinny
    wide: Path  # (time, space), wider than any exact SVD fits
    volume: Path  # (inline, crossline, sample)


def make_cube(root: Path, scale: float) -> Path:
    """Write the climate cube (2920 x ``scale`` days x 288 x 720, one-day chunks) under ``root``."""
    cube = synthetic_climate(int(2920 * scale), 288, 720, chunks={"time": 1})
    cube.to_zarr(root / "cube.zarr", mode="w")
    return root / "cube.zarr"


#: Shapes of the SVD inputs at ``--scale 1``: tall and skinny (exact SVD), and wide (compressed).
MATRIX_SHAPES = {"tall": (60000, 2000), "wide": (8000, 30000)}


def make_matrix(root: Path, name: str, scale: float) -> Path:
    """Write the ``name`` matrix (:data:`MATRIX_SHAPES`, its long side x ``scale``) under ``root``.

    Rank 20 plus noise, float32, in Zarr chunks of 1000 rows; deterministic (the seeds of
    ``name``'s position).
    """
    rows, cols = MATRIX_SHAPES[name]
    shape = (int(rows * scale), cols) if name == "tall" else (rows, int(cols * scale))
    rng = np.random.default_rng(list(MATRIX_SHAPES).index(name))
    basis = rng.standard_normal((20, shape[1])).astype("float32")
    data = dask.array.random.default_rng(1).standard_normal(
        (shape[0], 20), chunks=(1000, 20), dtype="float32"
    ) @ dask.array.from_array(basis) + 0.1 * dask.array.random.default_rng(2).standard_normal(
        shape, chunks=(1000, shape[1]), dtype="float32"
    )
    xr.DataArray(data.astype("float32"), dims=("time", "space"), name="field").to_dataset().to_zarr(
        root / f"{name}.zarr", mode="w"
    )
    return root / f"{name}.zarr"


def make_inputs(root: Path, scale: float) -> Inputs:
    """Write the stores (generated, deterministic) under ``root``."""
    make_cube(root, scale)
    for name in MATRIX_SHAPES:
        make_matrix(root, name, scale)
    side = int(512 * scale ** (1 / 3))
    volume = synthetic_seismic((side,) * 3, chunks=(64, 64, 64))
    volume.to_zarr(root / "volume.zarr", mode="w")
    return Inputs(root / "cube.zarr", root / "tall.zarr", root / "wide.zarr", root / "volume.zarr")


# --- the work, as each tool's user writes it --------------------------------------------------
# Each returns a zero-argument callable that computes and returns a small NumPy summary (for the
# value check) and the chunks the tool ran with.

Work = Callable[[], np.ndarray]


def _summary(values: Any) -> np.ndarray:
    return np.asarray(values, dtype="float64")


def _reduction(op: str) -> Callable[[xr.DataArray], xr.DataArray]:
    if op == "quantile":
        return lambda a: a.quantile(0.9, dim="time")
    return lambda a: getattr(a, op)("time")


def _climate(row: str, tas: xr.DataArray, method: str | None = None) -> xr.DataArray:
    """The row's xarray expression as memchunk's row decorates it, run by xarray (flox's
    ``method`` where given)."""
    from harness.climate_functions import FUNCTIONS

    return FUNCTIONS[CLIMATE[row]](tas, **({"method": method} if method else {}))


def _climate_summary(result: xr.DataArray) -> Callable[[], np.ndarray]:
    """The sum over time of the result, per month or per location: small, and a value check."""
    if isinstance(result, xr.Dataset):  # a fit's coefficients
        result = result.to_dataarray()
    total = result.astype("float64").sum([d for d in result.dims if d in ("time", "lat")])
    return lambda: _summary(total.values)


def dask_work(row: str, inputs: Inputs, method: str | None = None) -> tuple[Work, str]:
    """Dask's auto chunks and the call a Dask user writes."""
    if row == "anomaly-p90":  # flox's quantile per group needs time whole: the user rechunks
        tas = xr.open_zarr(inputs.cube, chunks="auto")["tas"]
        deviation = tas.groupby("time.month") - tas.groupby("time.month").mean()
        deviation = deviation.chunk({"time": -1, "lat": "auto", "lon": "auto"})
        return _climate_summary(deviation.groupby("time.month").quantile(0.9)), _chunks(tas)
    if row in CLIMATE:
        tas = xr.open_zarr(inputs.cube, chunks="auto")["tas"]
        return _climate_summary(_climate(row, tas, method)), _chunks(tas)
    if row in ("mean", "median", "quantile"):
        tas = xr.open_zarr(inputs.cube, chunks="auto")["tas"]
        if row == "quantile":  # xarray's quantile needs time in one chunk: the user asks for it
            tas = tas.chunk({"time": -1, "lat": "auto", "lon": "auto"})
        result = _reduction(row)(tas)
        return (lambda: _summary(result.values)), _chunks(tas)
    if row in ("svd-exact", "svd-compressed"):
        path = inputs.tall if row == "svd-exact" else inputs.wide
        field = xr.open_zarr(path, chunks="auto")["field"].data
        if row == "svd-exact":  # tsqr needs one chunk across the columns
            field = field.rechunk({0: "auto", 1: -1})
            _, s, _ = dask.array.linalg.svd(field)
        else:
            _, s, _ = dask.array.linalg.svd_compressed(field, 10, seed=0)
        return (lambda: _summary(s[:10].compute())), _chunks(field)
    amplitude = xr.open_zarr(inputs.volume, chunks="auto")["amplitude"].data
    dip = amplitude.map_overlap(gst3d_block, depth=GST3D_HALO, boundary="none", dtype="float32")
    return (lambda: _summary(_interior_sum(dip).compute())), _chunks(amplitude)


def memchunk_work(row: str, inputs: Inputs) -> tuple[Work, str]:
    """memchunk's plan on the same store (the active client's workers set the budget)."""
    if row in BUILT_IN:  # the built-in operator that computes the row's expression
        tas = xr.open_zarr(inputs.cube)["tas"]
        op, kwargs = BUILT_IN[row]
        plan = tas.memchunk.plan(op, **kwargs)
        return _climate_summary(plan.apply()), _chunks_of(plan.chunks)
    if row in CLIMATE:
        tas = xr.open_zarr(inputs.cube)["tas"]
        plan = tas.memchunk.plan(CLIMATE[row])
        return _climate_summary(plan.apply()), _chunks_of(plan.chunks)
    if row in ("mean", "median", "quantile"):
        tas = xr.open_zarr(inputs.cube)["tas"]
        kwargs = {"dim": "time"} | ({"q": 0.9} if row == "quantile" else {})
        plan = tas.memchunk.plan(row, **kwargs)  # planned once, as apply(row) plans
        result = plan.apply()
        return (lambda: _summary(result.values)), _chunks_of(plan.chunks)
    if row in ("svd-exact", "svd-compressed"):
        field = xr.open_zarr(inputs.tall if row == "svd-exact" else inputs.wide)["field"]
        kwargs: dict[str, Any] = {"sample_dims": ("time",)}
        if row == "svd-compressed":  # the Dask call's work: its default n_power_iter (0); the
            # compressed SVD named (method="auto" computes the exact one where it fits: at
            # --scale 0.05, 15x the time of the rank-10 one Dask's row computes)
            kwargs |= {"method": "compressed", "k": 10, "n_power_iter": 0}
        plan = field.memchunk.plan("svd", **kwargs)  # planned once, as apply("svd") plans
        result = plan.apply()
        return (lambda: _summary(result["S"][:10].values)), _chunks_of(plan.chunks)
    amplitude = xr.open_zarr(inputs.volume)["amplitude"]
    plan = amplitude.memchunk.plan("gst3d")  # planned once, as apply("gst3d") plans
    dip = plan.apply()
    return (lambda: _summary(_interior_sum(dip.data).compute())), _chunks_of(plan.chunks)


def cubed_work(row: str, inputs: Inputs, spec: Any) -> tuple[Work, str]:
    """Cubed through cubed-xarray, with its own chunks (the store's)."""
    import cubed
    import cubed.array_api as xp

    def open_(path: Path, name: str) -> xr.DataArray:
        return xr.open_zarr(path, chunked_array_type="cubed", from_array_kwargs={"spec": spec})[
            name
        ]

    if row in ("mean", "median", "quantile"):
        tas = open_(inputs.cube, "tas")
        result = _reduction(row)(tas)
        return (lambda: _summary(result.values)), _chunks(tas)
    if row in CLIMATE:
        tas = open_(inputs.cube, "tas")
        return _climate_summary(_climate(row, tas)), _chunks(tas)
    if row == "svd-exact":
        field = open_(inputs.tall, "field").data
        n_rows, n_cols = field.chunksize[0], field.shape[1]
        if n_rows < n_cols:  # its tsqr fails on blocks wider than tall: the user rechunks
            field = field.rechunk((n_cols, n_cols))
        _, s, _ = xp.linalg.svd(field, full_matrices=False)
        return (lambda: _summary(s[:10].compute())), _chunks(field)
    if row == "svd-compressed":
        raise NotImplementedError("Cubed has no compressed (randomized) SVD")
    amplitude = open_(inputs.volume, "amplitude").data
    padded = [c + 2 * GST3D_HALO for c in amplitude.chunksize]
    dip = cubed.map_overlap(
        _gst3d_trimmed,
        amplitude,
        dtype="float32",
        chunks=amplitude.chunks,
        depth=GST3D_HALO,
        boundary=0.0,  # Cubed's map_overlap pads with constants only
        extra_projected_mem=GST3D_BYTES_PER_VOXEL * int(np.prod(padded)),
    )
    total = _interior_sum(dip, xp)
    return (lambda: _summary(total.compute())), _chunks(amplitude)


def _interior_sum(dip: Any, xp: Any = None) -> Any:
    """Sum of dip over the voxels whose stencil lies inside the volume: the same for any
    padding at the volume's edge (Cubed pads with a constant, Dask and memchunk do not pad)."""
    h = GST3D_HALO
    inner = dip[h:-h, h:-h, h:-h]
    if xp is None:
        return inner.astype("float64").sum()
    return xp.sum(xp.astype(inner, xp.float64))


def _gst3d_trimmed(block: np.ndarray) -> np.ndarray:
    """GST3D of a padded block, halo trimmed (Cubed's map_overlap does not trim)."""
    h = GST3D_HALO
    return gst3d_block(block)[h:-h, h:-h, h:-h]


def _chunks(a: Any) -> str:
    data = getattr(a, "data", a)
    return " x ".join(str(max(c)) for c in data.chunks)


def _chunks_of(chunks: dict[str, int]) -> str:
    return " x ".join(str(n) for n in chunks.values())


# --- running and measuring ---------------------------------------------------------------------

ROWS = ("mean", "median", "quantile", "svd-exact", "svd-compressed", "gst3d", *CLIMATE)


def applies(row: str, tool: str) -> bool:
    """Whether ``tool`` runs ``row``: flox's cohorts method is for groupby rows only."""
    return tool != "flox-cohorts" or row in GROUPED


#: Relative tolerance of the value check against memchunk's result (randomized SVD: looser).
RTOL = {"svd-compressed": 1e-2}


@dataclass
class Result:
    """One run of one tool on one row."""

    row: str
    tool: str
    chunks: str = ""
    outcome: RunOutcome | None = None
    value: np.ndarray | None = None
    client_peak: int = 0

    @property
    def completed(self) -> bool:
        return self.outcome is not None and self.outcome.completed

    @property
    def seconds(self) -> float:
        return self.outcome.seconds if self.outcome else 0.0


def run_one(row: str, tool: str, inputs: Inputs, limit: str, spec: Any, timeout: float) -> Result:
    """Run ``row`` with ``tool`` once, on fresh workers, and measure it.

    A run with no result after ``timeout`` seconds is recorded as hung (a paused worker waits
    for memory that its own task holds), and its workers are closed.

    Building the computation is inside the measured run: a tool that plans (memchunk), or that
    computes while building (cubed-xarray's median), is timed and sampled for all it does.
    """
    result = Result(row, tool)
    values: list[np.ndarray] = []

    def run(build: Callable[[], tuple[Work, str]]) -> None:
        work, result.chunks = build()
        values.append(work())

    def timed(build: Callable[[], tuple[Work, str]]) -> Callable[[], None]:
        return lambda: within(timeout, lambda: run(build))

    with RssSampler(interval=0.02) as client_peak:  # this process: the client
        if tool == "cubed":
            result.outcome = watch(None, tool, timed(lambda: cubed_work(row, inputs, spec)))
            time.sleep(1.0)  # its pool is shut down without waiting: let the processes exit
        else:
            with fresh_client(2, 1, limit) as client:
                if tool == "memchunk":
                    build = memchunk_work
                else:
                    method = "cohorts" if tool == "flox-cohorts" else None
                    build = functools.partial(dask_work, method=method)
                result.outcome = watch(client, tool, timed(lambda: build(row, inputs)))
    xarray_memchunk.remove_staged_stores()  # computed: its staged input is not read again
    result.client_peak = client_peak.peak
    result.value = values[0] if values else None
    return result


def median_run(runs: list[Result]) -> Result:
    """The median-time completed run, or the first failure (a tool that failed once failed)."""
    failed = [r for r in runs if not r.completed]
    if failed:
        return failed[0]
    ranked = sorted(runs, key=lambda r: r.seconds)
    return ranked[(len(ranked) - 1) // 2]


def cubed_spec(root: Path, limit: str) -> tuple[Any, int]:
    """Cubed's ``Spec`` for the same per-process memory, with its reserved memory measured."""
    import cubed

    options = {"max_workers": 2}
    probe = cubed.Spec(work_dir=str(root / "cubed-work"), allowed_mem=limit)
    executor = cubed.runtime.create.create_executor("processes", options)
    reserved = cubed.measure_reserved_mem(executor, work_dir=probe.work_dir)
    spec = cubed.Spec(
        work_dir=str(root / "cubed-work"),
        allowed_mem=limit,
        reserved_mem=reserved,
        executor_name="processes",
        executor_options=options,
    )
    return spec, reserved


def format_table(best: dict[tuple[str, str], Result], limit: str) -> str:
    """Markdown: a row per (work, tool); memchunk's row carries its ratio to the best peer."""
    limit_bytes = parse_bytes(limit)
    lines = [
        "| work | tool | chunks | outcome | wall s | peak per worker MB | peak / limit | client "
        "peak MB | pauses | deaths | memchunk / best peer | values |",
        "| " + " | ".join(["---"] * 12) + " |",
    ]
    for row in [r for r in ROWS if any(key[0] == r for key in best)]:
        reference = best.get((row, "memchunk"))
        peers = [best[(row, t)] for t in TOOLS if t != "memchunk" and (row, t) in best]
        done = [p for p in peers if p.completed]
        for tool in TOOLS:
            r = best.get((row, tool))
            if r is None:
                continue
            if r.completed:
                outcome = "completed"
            else:
                outcome = r.outcome.error[:110]
            o = r.outcome
            peak = o.peak_bytes if o else 0
            ratio = ""
            if tool == "memchunk" and r.completed and done:
                ratio = f"{r.seconds / min(p.seconds for p in done):.2f}"
            values = ""
            if r.value is not None and reference is not None and reference.value is not None:
                close = np.allclose(r.value, reference.value, rtol=RTOL.get(row, 1e-4))
                values = "equal" if close else "DIFFER"
            pauses = "" if tool == "cubed" or o is None else str(o.pauses)
            deaths = "" if tool == "cubed" or o is None else str(o.worker_deaths)
            lines.append(
                f"| {row} | {tool} | {r.chunks} | {outcome} | "
                f"{r.seconds:.1f} | {peak / 1e6:.0f} | {peak / limit_bytes:.2f} | "
                f"{r.client_peak / 1e6:.0f} | {pauses} | "
                f"{deaths} | {ratio} | {values} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="1GB", help="per worker (process)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=ROWS, help="rows to run")
    parser.add_argument("--tools", nargs="*", choices=TOOLS, help="tools to run (all)")
    parser.add_argument("--scale", type=float, default=1.0, help="input sizes, x 2,920 days")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds before a run hangs")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "peers.md"))
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    tools = [t for t in TOOLS if t in (args.tools or TOOLS)]
    with tempfile.TemporaryDirectory(prefix="memchunk-peers-") as tmp:
        root = Path(tmp)
        # first, while this process is small: on Linux a spawned process's ru_maxrss (which
        # cubed.measure_reserved_mem reads) starts at its parent's, so it measured 1.2 GB
        # after the inputs were written and 0.24 GB before
        spec, reserved = cubed_spec(root, args.memory_limit)
        print(f"cubed reserved_mem, measured: {reserved / 1e6:.0f} MB", flush=True)
        inputs = make_inputs(root, args.scale)
        runs: dict[tuple[str, str], list[Result]] = {}
        for repeat in range(args.repeats):
            for row in rows:
                for i in range(len(tools)):  # each repeat starts one tool later
                    tool = tools[(i + repeat) % len(tools)]
                    if not applies(row, tool):
                        continue
                    result = run_one(row, tool, inputs, args.memory_limit, spec, args.timeout)
                    print(
                        f"[{repeat + 1}/{args.repeats}] {row:<15} {tool:<9} "
                        f"{result.outcome.error or 'completed'} "
                        f"{result.seconds:.1f} s",
                        flush=True,
                    )
                    runs.setdefault((row, tool), []).append(result)
        best = {key: median_run(value) for key, value in runs.items()}
        sizes = ", ".join(
            f"{p.name} {sum(f.stat().st_size for f in p.rglob('*') if f.is_file()) / 1e9:.2f} GB"
            for p in (inputs.cube, inputs.tall, inputs.wide, inputs.volume)
        )
    seconds = {k: [round(r.seconds, 1) for r in v] for k, v in runs.items()}
    table = format_table(best, args.memory_limit)
    import cubed

    header = (
        f"Measured {datetime.date.today()} on {platform.node()} ({platform.machine()}, Python "
        f"{platform.python_version()}) with `python {' '.join(sys.argv)}`: 2 processes x 1 "
        f"thread x {args.memory_limit}; median of {args.repeats}; dask {dask.__version__}, "
        f"cubed {cubed.__version__} (reserved_mem measured: {reserved / 1e6:.0f} MB).\n"
        f"Stores on disk (Zarr, compressed): {sizes}."
    )
    print(header + "\n\n" + table)
    print("wall s of every run:", seconds)
    Path(args.out).write_text(header + "\n\n" + table + "\n")


if __name__ == "__main__":
    main()

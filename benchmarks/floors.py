"""Each workload against its floor: what the machine allows, measured in the same run.

    python benchmarks/floors.py                         # every row; median of 3
    python benchmarks/floors.py --only svd-exact svd-compressed
    python benchmarks/floors.py --only median --repeats 1 --scale 0.25
    python benchmarks/floors.py --only median quantile --tools memchunk   # floor and memchunk

The floor of a reduction over time of the climate cube (Zarr, one-day zstd chunks, as in
``peers.py``) is reading the store once with 2 threads (the fastest of
``xarray.open_zarr(...).load()`` on Dask's threaded scheduler, zarr's own read of the whole
array, and memchunk's direct reads of the chunk files) plus the reduction of the array in
memory on the same 2 threads (over longitude slabs). Against it, on a fresh ``LocalCluster``
of 2 workers x 1 thread x ``--memory-limit`` each run, whose workers import the libraries
before the timer starts, as the floor's process has them (``--cold``: in the timed run; a
fresh cluster's first run pays for them):

- ``memchunk``: ``tas.memchunk.apply(op, dim="time")``, as it plans (where its chunks would
  read each storage chunk many times over, it stages the store first:
  :mod:`xarray_memchunk.operators.read_once`);
- ``memchunk in memory``: the same, never staging to spare re-reads (what the plan did before),
  and ``memchunk staged``: always staging where a plan re-reads (the two sides of the choice);
- ``dask``: the call a Dask user writes on the store's auto chunks (time whole for the median
  and quantile, as xarray asks) — the best peer in ``peers.md`` for these rows; Cubed's rows
  are there.

The floor of GST3D (dip, the Gaussian kernel, sigma 1, rho 2) on a seismic volume (384^3 x
``--scale`` float32, Zarr in 128^3 chunks) is reading the store once plus memchunk's kernel on
the volume in memory on the same 2 threads. Against it: ``memchunk`` on the cluster; ``dask``,
``map_overlap`` of the same kernel on the store's chunks; and ``structure-tensor``, the PyPI
package's ``parallel_structure_tensor_analysis`` (2 processes, its own blocks, no memory limit:
the eigenvectors dip is made from, from the volume read once; its peak is its largest process's
RSS).

The floor of an SVD (``svd-exact`` of the tall and skinny matrix, 60000 x ``--scale`` x 2000;
``svd-compressed``, 10 components with no power iteration, of the wide one, 8000 x 30000 x
``--scale``; float32 Zarr in chunks of 1000 rows, as in ``peers.py``) is reading the store once
plus the fastest in memory of NumPy (LAPACK's ``gesdd``, and a QR then the SVD of its R; for
the compressed one, the same randomized range finder and its SVD in NumPy) and Dask on the
array in memory (``svd``, ``svd_compressed``), on the same 2 threads. Against it:
``memchunk``, ``apply("svd", sample_dims=("time",))``; and ``dask``, the call a Dask user
writes on the store's auto chunks (rechunked to one chunk across the columns, as tsqr needs,
for the exact one).

Each repeat measures the floor in turn with the tools, in an order that rotates from repeat to
repeat, so that a machine whose speed drifts over the run moves the floor with the tools more
nearly alike. The median-time run is kept (a failed run where one failed); the floor row shows
the medians of the reads and of the work in memory. ``/ floor`` is each run against its own
repeat's floor: the median over the runs, or the failed run's own. So a row's ``wall s`` over
the floor row's need not give its ``/ floor``. Prints a Markdown table and writes it to
``benchmarks/results/floors.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr
from harness.fresh import fresh_client
from harness.timeouts import within
from peers import GST3D_HALO, make_cube, make_matrix

import xarray_memchunk  # the .memchunk accessor, and remove_staged_stores
from xarray_memchunk.datasets import synthetic_seismic
from xarray_memchunk.operators import read_once
from xarray_memchunk.operators.gst3d.kernels import gst3d_block
from xarray_memchunk.testing import watch

REDUCTIONS = ("median", "quantile", "mean")
#: The SVD rows and the matrix each decomposes (``peers.MATRIX_SHAPES``).
SVDS = {"svd-exact": "tall", "svd-compressed": "wide"}
ROWS = (*REDUCTIONS, "gst3d", *SVDS)
TOOLS = {
    **dict.fromkeys(REDUCTIONS, ("memchunk", "memchunk in memory", "memchunk staged", "dask")),
    "gst3d": ("memchunk", "dask", "structure-tensor"),
    **dict.fromkeys(SVDS, ("memchunk", "dask")),
}
#: Components of the compressed SVD (the Dask call's ``k``; no power iteration, its default).
COMPONENTS = 10
#: Side of the GST3D volume at ``--scale 1``, and its storage chunk.
VOLUME_SIDE, VOLUME_CHUNK = 384, 128
#: The staging decision forced, for the tools that force it: (STAGING_GAIN, MIN_REREAD_SECONDS).
FORCED = {"memchunk in memory": (math.inf, math.inf), "memchunk staged": (0.0, 0.0)}
#: The floor's place among each repeat's routes (it takes its turn in the rotation).
FLOOR = "floor"


def measure_floor(
    op: str, volume: Path | None, matrices: dict[str, Path], cube: Path | None
) -> tuple[float, float]:
    """``op``'s floor once: seconds to read its input once and to compute it in memory."""
    if op == "gst3d":
        assert volume is not None
        return gst3d_floor_seconds(volume)
    if op in SVDS:
        return svd_floor_seconds(op, matrices[op])
    assert cube is not None
    return floor_seconds(op, cube)


def _reduce(op: str, data: xr.DataArray) -> xr.DataArray:
    if op == "quantile":
        return data.quantile(0.9, dim="time")
    return getattr(data, op)("time")


def make_volume(root: Path, scale: float) -> Path:
    """Write the seismic volume (384^3 x ``scale``, float32, 128^3 Zarr chunks) under ``root``."""
    side = round(VOLUME_SIDE * scale ** (1 / 3))
    synthetic_seismic((side,) * 3, chunks=(VOLUME_CHUNK,) * 3).to_zarr(root / "volume.zarr")
    return root / "volume.zarr"


def gst3d_floor_seconds(volume: Path) -> tuple[float, float]:
    """Seconds to read the volume once and to compute its dip in memory, both on 2 threads."""
    with dask.config.set(scheduler="threads", num_workers=2):
        start = time.perf_counter()
        amplitude = xr.open_zarr(volume)["amplitude"].load()
        read = time.perf_counter() - start
        start = time.perf_counter()
        amplitude.memchunk.apply("gst3d").compute()
        return read, time.perf_counter() - start


def floor_seconds(op: str, cube: Path) -> tuple[float, float]:
    """Seconds to read the store once and to reduce it in memory, both on 2 threads.

    Each the fastest of its ways: the read with xarray (Dask's threads, one task per storage
    chunk), with zarr alone (its own concurrent reads of the whole array), or with each
    chunk's file decoded straight into the array (memchunk's direct reads, two threads over
    halves of time); the reduction with xarray over longitude slabs or with memchunk's
    operator, both on Dask's threads, or with memchunk's NumPy kernel on two longitude halves
    of the array (views) on two threads.
    """
    from concurrent.futures import ThreadPoolExecutor

    import zarr

    from xarray_memchunk.operators.zarr_reads import DirectChunkReads

    with dask.config.set(scheduler="threads", num_workers=2):
        start = time.perf_counter()
        tas = xr.open_zarr(cube)["tas"].load()
        by_xarray = time.perf_counter() - start
        array = zarr.open_group(cube, mode="r")["tas"]
        start = time.perf_counter()
        array[...]
        by_zarr = time.perf_counter() - start
        direct = DirectChunkReads.of(array)
        assert direct is not None, "the cube's layout is one the direct reads read"
        half = direct.shape[0] // 2
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(direct.__getitem__, [slice(0, half), slice(half, None)]))
        by_direct = time.perf_counter() - start
        slabs = tas.chunk({"time": -1, "lat": -1, "lon": math.ceil(tas.sizes["lon"] / 8)})
        start = time.perf_counter()
        _reduce(op, slabs).compute()
        xarray_compute = time.perf_counter() - start
        kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
        start = time.perf_counter()
        tas.memchunk.apply(op, **kwargs).compute()
        memchunk_compute = time.perf_counter() - start
        start = time.perf_counter()
        _kernel_on_halves(op, tas.values)
        kernel_compute = time.perf_counter() - start
    return min(by_xarray, by_zarr, by_direct), min(xarray_compute, memchunk_compute, kernel_compute)


def _kernel_on_halves(op: str, values: np.ndarray) -> list[np.ndarray]:
    """memchunk's NumPy kernel of ``op`` over time, on two longitude halves (views), 2 threads.

    No Dask: no graph, no copy of a block into another layout.
    """
    from concurrent.futures import ThreadPoolExecutor

    from xarray_memchunk.operators.whole_dims import _medians, _quantiles_last

    def half(index: slice) -> np.ndarray:
        block = np.moveaxis(values[:, :, index], 0, -1)  # time last, as the kernels take it
        if op == "median":
            return _medians(block, (-1,), values.dtype)
        if op == "quantile":
            return _quantiles_last(block, np.nanquantile, [0.9], (-1,), "linear", values.dtype)
        return getattr(np, f"nan{op}")(block, axis=-1)

    middle = values.shape[2] // 2
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(half, [slice(0, middle), slice(middle, None)]))


def svd_floor_seconds(row: str, matrix: Path) -> tuple[float, float]:
    """Seconds to read the matrix once and to decompose it in memory, both on 2 threads.

    The read is the faster of xarray's (Dask's threads) and zarr's alone. The decomposition is
    the fastest of NumPy's (BLAS on 2 threads: LAPACK's SVD, and for the exact one also a QR
    then the SVD of its R), Dask's on the array in memory (its threaded scheduler, one BLAS
    thread per task, blocks of 5000 rows for tsqr, 1000 for the compressed one).
    """
    import zarr
    from threadpoolctl import threadpool_limits

    exact = row == "svd-exact"
    with dask.config.set(scheduler="threads", num_workers=2), threadpool_limits(2):
        start = time.perf_counter()
        field = xr.open_zarr(matrix)["field"].values
        by_xarray = time.perf_counter() - start
        start = time.perf_counter()
        zarr.open_group(matrix, mode="r")["field"][...]
        by_zarr = time.perf_counter() - start
        in_memory = []
        ways = (_thin_svd, _svd_of_qr) if exact else (_randomized_svd,)
        for way in ways:
            start = time.perf_counter()
            way(field) if exact else way(field, COMPONENTS)
            in_memory.append(time.perf_counter() - start)
        blocks = dask.array.from_array(field, chunks=(5000 if exact else 1000, -1))
        with threadpool_limits(1):  # Dask's 2 threads, one BLAS thread each
            start = time.perf_counter()
            if exact:
                dask.compute(*dask.array.linalg.svd(blocks))
            else:
                dask.compute(*dask.array.linalg.svd_compressed(blocks, COMPONENTS, seed=0))
            in_memory.append(time.perf_counter() - start)
    return min(by_xarray, by_zarr), min(in_memory)


def _thin_svd(field: np.ndarray) -> tuple[np.ndarray, ...]:
    """LAPACK's SVD, as many singular vectors as the matrix has columns."""
    return np.linalg.svd(field, full_matrices=False)


def _svd_of_qr(field: np.ndarray) -> tuple[np.ndarray, ...]:
    """The thin SVD of a tall matrix as Q R, then the SVD of the small R."""
    q, r = np.linalg.qr(field)
    u, s, v = np.linalg.svd(r)
    return q @ u, s, v


def _randomized_svd(field: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Dask's ``svd_compressed`` (no power iteration) in NumPy: Halko et al.'s range finder."""
    oversampled = k + 10  # Dask's default oversampling
    sketch = np.random.default_rng(0).standard_normal((field.shape[1], oversampled))
    q, _ = np.linalg.qr(field @ sketch.astype(field.dtype))
    u, s, v = np.linalg.svd(q.T @ field, full_matrices=False)
    return (q @ u)[:, :k], s[:k], v[:k]


def run_svd_tool(row: str, tool: str, matrix: Path, limit: str, timeout: float) -> dict:
    """One SVD run of ``tool`` on fresh workers: its outcome, seconds, peak and chunks."""
    found: dict = {"tool": tool}

    def work() -> None:
        field = xr.open_zarr(matrix)["field"]
        if tool == "dask":
            data = xr.open_zarr(matrix, chunks="auto")["field"].data
            if row == "svd-exact":  # tsqr needs one chunk across the columns
                data = data.rechunk({0: "auto", 1: -1})
                _, s, _ = dask.array.linalg.svd(data)
            else:
                _, s, _ = dask.array.linalg.svd_compressed(data, COMPONENTS, seed=0)
            found["total"] = float(s[:COMPONENTS].sum().compute())
            found["chunks"] = " x ".join(str(max(c)) for c in data.chunks)
            return
        kwargs: dict[str, Any] = {"sample_dims": ("time",)}
        if row == "svd-compressed":  # the Dask call's work: no power iteration
            kwargs |= {"k": COMPONENTS, "n_power_iter": 0}
        plan = field.memchunk.plan("svd", **kwargs)
        found["total"] = float(plan.apply()["S"][:COMPONENTS].sum().values)
        found["chunks"] = " x ".join(str(n) for n in plan.chunks.values())

    return found | _watched(work, limit, timeout, tool)


def run_gst3d_tool(tool: str, volume: Path, limit: str, timeout: float) -> dict:
    """One GST3D run of ``tool``: on fresh workers, or structure-tensor's own processes."""
    if tool == "structure-tensor":
        return _structure_tensor(volume, timeout)
    found: dict = {"tool": tool}

    def work() -> None:
        amplitude = xr.open_zarr(volume)["amplitude"]
        if tool == "dask":
            data = amplitude.data
            dip = data.map_overlap(gst3d_block, depth=GST3D_HALO, boundary="none", dtype="f4")
            found["chunks"] = " x ".join(str(max(c)) for c in data.chunks)
        else:
            plan = amplitude.memchunk.plan("gst3d")
            dip = plan.apply().data
            found["chunks"] = " x ".join(str(n) for n in plan.chunks.values())
        found["total"] = float(dip.astype("float64").sum().compute())

    return found | _watched(work, limit, timeout, tool)


def _structure_tensor(volume: Path, timeout: float) -> dict:
    """structure-tensor's ``parallel_structure_tensor_analysis`` on 2 processes, timed."""
    import psutil
    from structure_tensor.multiprocessing import parallel_structure_tensor_analysis

    def work() -> None:
        amplitude = xr.open_zarr(volume)["amplitude"].values
        parallel_structure_tensor_analysis(
            amplitude, 1.0, 2.0, truncate=3.0, devices=["cpu", "cpu"], eigenvalues=None
        )

    me, peak, done = psutil.Process(), [0], []

    def sample() -> None:
        while not done:
            with contextlib.suppress(psutil.Error):
                tree = [me, *me.children(recursive=True)]
                peak[0] = max(peak[0], *(p.memory_info().rss for p in tree))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    error = ""
    try:
        within(timeout, work)
    except Exception as exc:  # recorded as the run's outcome
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    done.append(True)
    sampler.join()
    return {
        "tool": "structure-tensor",
        "chunks": "its blocks of 128",
        "completed": not error,
        "error": error,
        "seconds": seconds,
        "peak": peak[0],
        "pauses": 0,
        "deaths": 0,
    }


#: Whether each fresh cluster's workers import the libraries before the timer starts, as the
#: floor's process has (``--cold``: not).
WARM_WORKERS = True


def _import_libraries() -> None:
    """What a worker imports for any row's first task; the floor's process has it imported."""
    import dask.array  # noqa: F401
    import numcodecs  # noqa: F401
    import xarray  # noqa: F401
    import zarr  # noqa: F401

    import xarray_memchunk  # noqa: F401


def _watched(work: Any, limit: str, timeout: float, tool: str) -> dict:
    """``work`` run on a fresh ``LocalCluster`` of 2 workers x 1 thread x ``limit``, watched.

    The workers import the libraries first, untimed (:data:`WARM_WORKERS`). What it staged is
    removed after it (computed: not read again).
    """
    with fresh_client(2, 1, limit) as client:
        if WARM_WORKERS:
            client.run(_import_libraries)
        outcome = watch(client, tool, lambda: within(timeout, work))
    xarray_memchunk.remove_staged_stores()
    return {
        "completed": outcome.completed,
        "error": outcome.error,
        "seconds": outcome.seconds,
        "peak": outcome.peak_bytes,
        "pauses": outcome.pauses,
        "deaths": outcome.worker_deaths,
    }


def run_tool(op: str, tool: str, cube: Path, limit: str, timeout: float) -> dict:
    """One run of ``tool`` on fresh workers: its outcome, seconds, peak and chunks."""
    found: dict = {"tool": tool}

    def work() -> None:
        tas = xr.open_zarr(cube)["tas"]
        if tool == "dask":
            data = tas.chunk({"time": -1, "lat": "auto", "lon": "auto"}) if op != "mean" else tas
            found["total"] = float(np.nansum(_reduce(op, data).values, dtype="float64"))
            found["chunks"] = " x ".join(str(max(c)) for c in data.chunks)
            return
        kwargs = {"dim": "time"} | ({"q": 0.9} if op == "quantile" else {})
        kept = read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS
        read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS = FORCED.get(tool, kept)
        try:
            start = time.perf_counter()
            plan = tas.memchunk.plan(op, **kwargs)
            planned = time.perf_counter()
            result = plan.apply()
            applied = time.perf_counter()
            found["total"] = float(np.nansum(result.values, dtype="float64"))
            found["phases"] = {
                "plan": round(planned - start, 2),
                "apply": round(applied - planned, 2),
                "compute": round(time.perf_counter() - applied, 2),
            }
        finally:
            read_once.STAGING_GAIN, read_once.MIN_REREAD_SECONDS = kept
        found["chunks"] = " x ".join(str(n) for n in plan.chunks.values())
        found["staged"] = any("temporary Zarr store" in note for note in plan.notes)
        found["not_staged"] = next((n for n in plan.notes if n.startswith("not staged")), "")

    return found | _watched(work, limit, timeout, tool)


def _ratio(kept: dict, found: list[dict], floors: list[tuple[float, float]]) -> float:
    """A route's ``/ floor``: each run against its own repeat's floor.

    Where a run failed, the kept (failed) run's own; else the median over the runs.
    """

    def against_floor(run: dict) -> float:
        return run["seconds"] / sum(floors[run["repeat"]])

    if not kept["completed"]:
        return against_floor(kept)
    return statistics.median(map(against_floor, found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="1GB", help="per worker (process)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=ROWS, help="rows to run")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="each input's size against its default (the cube's days, the volume's voxels, the "
        "matrices' long side)",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--cold", action="store_true", help="time the workers' first imports too (not warmed)"
    )
    parser.add_argument(
        "--tools", nargs="*", help="routes to run of each row's (default: all of them)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "floors.md"))
    args = parser.parse_args()
    global WARM_WORKERS
    WARM_WORKERS = not args.cold
    rows = args.only or list(ROWS)
    lines = [
        "| work | route | chunks | outcome | wall s | / floor | peak per worker MB | pauses "
        "| deaths |",
        "| " + " | ".join(["---"] * 9) + " |",
    ]
    every: dict[str, list[float]] = {}
    inputs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="memchunk-floors-") as tmp:
        cube = volume = None
        if set(rows) & set(REDUCTIONS):
            cube = make_cube(Path(tmp), args.scale)
            nbytes = xr.open_zarr(cube)["tas"].nbytes
            inputs.append(f"the cube {nbytes / 1e9:.2f} GB float32 in one-day Zarr chunks")
        if "gst3d" in rows:
            volume = make_volume(Path(tmp), args.scale)
            shape = xr.open_zarr(volume)["amplitude"].shape
            inputs.append(f"the volume {' x '.join(map(str, shape))} float32 in 128^3 chunks")
        matrices = {}
        for row in set(rows) & set(SVDS):
            matrices[row] = make_matrix(Path(tmp), SVDS[row], args.scale)
            shape = xr.open_zarr(matrices[row])["field"].shape
            inputs.append(
                f"the {SVDS[row]} matrix {' x '.join(map(str, shape))} float32 in chunks of "
                f"1000 rows"
            )
        for op in rows:
            tools = [t for t in TOOLS[op] if not args.tools or t in args.tools]
            floors: list[tuple[float, float]] = []
            runs: dict[str, list[dict]] = {t: [] for t in tools}
            for repeat in range(args.repeats):
                routes = [FLOOR, *tools]
                for i in range(len(routes)):
                    route = routes[(i + repeat) % len(routes)]
                    if route == FLOOR:
                        floors.append(measure_floor(op, volume, matrices, cube))
                        print(f"[{repeat + 1}] {op} floor: {floors[-1]}", flush=True)
                        continue
                    if op == "gst3d":
                        found = run_gst3d_tool(route, volume, args.memory_limit, args.timeout)
                    elif op in SVDS:
                        found = run_svd_tool(
                            op, route, matrices[op], args.memory_limit, args.timeout
                        )
                    else:
                        found = run_tool(op, route, cube, args.memory_limit, args.timeout)
                    runs[route].append(found | {"repeat": repeat})
                    print(f"[{repeat + 1}] {op} {route}: {found}", flush=True)
            read = statistics.median(f[0] for f in floors)
            compute = statistics.median(f[1] for f in floors)
            floor = read + compute
            every[f"{op} floor"] = [round(sum(f), 1) for f in floors]
            print(f"{op} floor: read {read:.2f} s + in memory {compute:.2f} s", flush=True)
            lines.append(
                f"| {op} | floor: read once {read:.1f} s + in memory {compute:.1f} s | | | "
                f"{floor:.1f} | 1.00 | | | |"
            )
            for tool, found in runs.items():
                every[f"{op} {tool}"] = [round(f["seconds"], 1) for f in found]
                failed = [f for f in found if not f["completed"]]
                ranked = sorted(found, key=lambda f: f["seconds"])
                kept = failed[0] if failed else ranked[(len(ranked) - 1) // 2]
                outcome = "completed" if kept["completed"] else kept["error"][:80]
                staged = " (staged)" if kept.get("staged") and tool == "memchunk" else ""
                ratio = _ratio(kept, found, floors)
                lines.append(
                    f"| {op} | {tool}{staged} | {kept.get('chunks', '')} | {outcome} | "
                    f"{kept['seconds']:.1f} | {ratio:.2f} | "
                    f"{max(f['peak'] for f in found) / 1e6:.0f} | "
                    f"{sum(f['pauses'] for f in found)} | {sum(f['deaths'] for f in found)} |"
                )
    header = (
        f"Measured {datetime.date.today()} on {platform.node()} ({platform.machine()}, Python "
        f"{platform.python_version()}) with `python {shlex.join(sys.argv)}`: "
        f"{'; '.join(inputs)}; 2 workers x 1 thread x "
        f"{args.memory_limit}; median of {args.repeats}, the floor measured in each repeat "
        f"in turn with the tools (`/ floor`: the median of each run against its own repeat's "
        f"floor, not the row's wall s over the floor row's; pauses and deaths summed over "
        f"runs, peak the largest); each fresh cluster's workers "
        f"{'import' if args.cold else 'imported'} the libraries "
        f"{'in the timed run' if args.cold else 'before the timer'}; dask {dask.__version__}, "
        f"numpy {np.__version__}."
    )
    table = header + "\n\n" + "\n".join(lines)
    print(table)
    print("wall s of every run:", every)
    Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()

"""SEG-Y to Zarr: memchunk ingest on a LocalCluster against segyio.tools.cube + to_zarr.

    python benchmarks/segy_ingest.py                        # 800^3 float32 (2.05 GB), 3 runs
    python benchmarks/segy_ingest.py --size 300 --repeats 1 # quick
    python benchmarks/segy_ingest.py --segy volume.sgy      # an existing file
    python benchmarks/segy_ingest.py --mdio-python .venv-peers312/bin/python   # and MDIO

Generates the SEG-Y file once (IEEE float32, inline-sorted, from ``synthetic_seismic``, written
an inline at a time), then runs each case in a fresh process, the order of the cases rotated on
each repeat, and quotes medians:

- ``memchunk ingest``: 128^3 storage chunks, LocalCluster 2 workers x 1 thread x 1.5GB;
- ``memchunk ingest --for gst3d``: storage chunks from gst3d's plan on that cluster;
- ``memchunk ingest (command line)``: the command a user types, ``memchunk ingest IN OUT
  --memory-limit 1.5GB``, timed whole (interpreter start and imports included): with no
  ``--scheduler`` it writes with threads in its own process, starting no cluster;
- ``segyio cube + to_zarr``: ``segyio.tools.cube`` (the whole volume in memory), then
  ``to_zarr`` in 128^3 chunks with Dask's threaded scheduler (2 threads): the read-once route;
- ``mdio segy_to_mdio`` (with ``--mdio-python``, an interpreter with ``multidimio``, which needs
  Python 3.12: ``benchmarks/peer_venv.sh`` makes one): MDIO's ``PostStack3DTime`` template,
  rev 1 headers, its own chunks and workers.

Peak memory: the largest sampled RSS of any worker, and each process's own peak RSS
(``VmHWM``; for the cube and command-line cases that process does all the work). Three
inlines of every store are checked against the file. Writes the table to
``benchmarks/results/segy_ingest.txt``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "memchunk ingest (command line)"
CASES = ("memchunk ingest", "memchunk ingest --for gst3d", COMMAND, "segyio cube + to_zarr")
MDIO = "mdio segy_to_mdio"
MEMORY_LIMIT = "1.5GB"


def _own_peak() -> int:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` would keep the parent's across exec).

    Read here, not with the library's helper: the MDIO case runs in another interpreter.
    """
    try:
        with open("/proc/self/status") as status:
            line = next(row for row in status if row.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _mdio(source: str, target: str) -> dict:
    """MDIO's ingest of the file, in this process (an interpreter with ``multidimio``)."""
    import mdio
    import numpy as np
    import segyio
    from mdio.builder.template_registry import TemplateRegistry
    from segy.standards import get_segy_standard

    start = time.perf_counter()
    mdio.segy_to_mdio(
        segy_spec=get_segy_standard(1.0),
        mdio_template=TemplateRegistry().get("PostStack3DTime"),
        input_path=source,
        output_path=target,
        overwrite=True,
    )
    seconds = time.perf_counter() - start
    amplitude = mdio.open_mdio(target)["amplitude"]
    with segyio.open(source) as f:
        picks = (0, len(f.ilines) // 2, len(f.ilines) - 1)
        equal = all(np.array_equal(amplitude[i].values, f.iline[f.ilines[i]]) for i in picks)
    chunks = "x".join(str(c) for c in amplitude.encoding.get("chunks", ()))
    return {
        "seconds": seconds,
        "worker_peak": 0,
        "process_peak": _own_peak(),
        "ok": True,
        "equal": equal,
        "chunks": chunks or "MDIO's",
    }


def run_case(case: str, source: str, target: str) -> dict:
    """One case in this (fresh) process; returns what it measured."""
    if case == MDIO:
        return _mdio(source, target)
    if case == "segyio cube + to_zarr":
        import dask
        import segyio
        import xarray as xr

        start = time.perf_counter()
        with segyio.open(source) as f:
            cube = segyio.tools.cube(f)
        da = xr.DataArray(cube, dims=("inline", "crossline", "sample"), name="amplitude")
        with dask.config.set(scheduler="threads", num_workers=2):
            da.chunk(128).to_zarr(target)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "worker_peak": 0, "process_peak": _own_peak(), "ok": True}

    if case == COMMAND:
        command = [sys.executable, "-m", "xarray_memchunk.cli", "ingest", source, target]
        start = time.perf_counter()
        done = subprocess.run(
            [*command, "--memory-limit", MEMORY_LIMIT], capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        error = done.stderr.strip().splitlines()[-1:] if done.returncode else []
        return {
            "seconds": seconds,
            "worker_peak": 0,
            "process_peak": peak,
            "ok": done.returncode == 0,
            "error": "".join(error),
        }

    from distributed import Client, LocalCluster

    from xarray_memchunk.seismic.ingest import ingest
    from xarray_memchunk.testing import watch

    operator = "gst3d" if case.endswith("gst3d") else None
    chunks = {}

    def work() -> None:
        _, storage, _ = ingest(source, target, operator=operator)
        chunks.update(storage)

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=MEMORY_LIMIT, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        outcome = watch(client, case, work)
    return {
        "seconds": outcome.seconds,
        "worker_peak": outcome.peak_bytes,
        "process_peak": _own_peak(),
        "pauses": outcome.pauses,
        "deaths": outcome.worker_deaths,
        "ok": outcome.completed,
        "error": outcome.error,
        "chunks": "x".join(str(c) for c in chunks.values()),
    }


def _check(source: str, target: str) -> bool:
    """Three inlines of the store equal segyio's reading of them."""
    import numpy as np
    import segyio
    import xarray as xr

    store = xr.open_zarr(target).amplitude
    with segyio.open(source) as f:
        picks = (0, len(f.ilines) // 2, len(f.ilines) - 1)
        return all(np.array_equal(store[i].values, f.iline[f.ilines[i]]) for i in picks)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=800, help="volume edge (default 800)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--segy", help="use this SEG-Y file instead of generating one")
    parser.add_argument("--mdio-python", help="an interpreter with multidimio: add MDIO's row")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # a child process: one case
        print(json.dumps(run_case(args.case, args.source, args.target)))
        return

    from xarray_memchunk.datasets import synthetic_seismic
    from xarray_memchunk.io import write_segy

    cases = CASES + ((MDIO,) if args.mdio_python else ())

    root = Path(tempfile.mkdtemp(prefix="memchunk-segy-"))
    try:
        if args.segy:
            source = Path(args.segy)
            from xarray_memchunk.seismic.segy import read_geometry

            shape = read_geometry(source).shape
        else:
            source = root / "volume.sgy"
            shape = (args.size,) * 3
            start = time.perf_counter()
            volume = synthetic_seismic(shape, chunks=(8, args.size, args.size)).amplitude
            write_segy(volume, source)
            print(f"wrote {source.name}: in {time.perf_counter() - start:.0f} s")
        size = source.stat().st_size
        runs: dict[str, list[dict]] = {c: [] for c in cases}
        for r in range(args.repeats):
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                target = root / "out.zarr"
                shutil.rmtree(target, ignore_errors=True)
                python = args.mdio_python if case == MDIO else sys.executable
                command = [python, __file__, "--case", case]
                command += ["--source", str(source), "--target", str(target)]
                child = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                )
                if child.returncode != 0:
                    found = {"ok": False, "error": child.stderr.strip().splitlines()[-1]}
                else:
                    found = json.loads(child.stdout.strip().splitlines()[-1])
                    if "equal" not in found:  # MDIO's case checks its own store
                        found["equal"] = _check(str(source), str(target))
                runs[case].append(found)
                print(case, {k: v for k, v in found.items() if k != "error"}, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    lines = [
        f"SEG-Y {shape} float32 ({_mb(size)}) to Zarr, median of {args.repeats} "
        f"(order rotated); LocalCluster 2 workers x 1 thread x {MEMORY_LIMIT} for memchunk",
        f"command: python {' '.join(sys.argv)}",
        f"{'case':<30} {'storage chunks':>15} {'wall s':>7} {'MB/s':>6} {'peak/worker':>12} "
        f"{'process peak':>13} {'pauses':>6} {'deaths':>6} {'values':>7}",
    ]
    for case, found in runs.items():
        done = [f for f in found if f.get("ok")]
        if not done:
            lines.append(f"{case:<30} failed: {found[0].get('error', '')}")
            continue
        seconds = statistics.median(f["seconds"] for f in done)
        lines.append(
            f"{case:<30} {done[0].get('chunks', '128x128x128'):>15} {seconds:7.1f} "
            f"{size / 1e6 / seconds:6.0f} "
            f"{_mb(max(f['worker_peak'] for f in done)) if done[0]['worker_peak'] else '-':>12} "
            f"{_mb(statistics.median(f['process_peak'] for f in done)):>13} "
            f"{sum(f.get('pauses', 0) for f in done):>6} "
            f"{sum(f.get('deaths', 0) for f in done):>6} "
            f"{'equal' if all(f['equal'] for f in done) else 'DIFFER':>7}"
        )
    lines.append(
        "peak/worker: largest sampled RSS of a worker over all runs; process peak: the median "
        "of each run's own peak RSS (the client for memchunk on a cluster; everything for the "
        "command line and the cube); "
        "pauses and deaths summed over runs; values: 3 inlines of each store against segyio"
    )
    table = "\n".join(lines)
    print(table)
    (Path(__file__).parent / "results" / "segy_ingest.txt").write_text(table + "\n")


if __name__ == "__main__":
    main()

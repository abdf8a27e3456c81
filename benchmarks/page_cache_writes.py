"""What writing staged bytes to a file costs, against copying them in memory.

    python benchmarks/page_cache_writes.py                       # 1.2 GB, 3 repeats
    python benchmarks/page_cache_writes.py --gigabytes 0.5 --repeats 5

A staged plan of ``benchmarks/floors.py``'s median writes each worker's half of the 2.42 GB
cube (1.2 GB) into a store in ``/dev/shm``, then maps it back. In one thread, this times
writing that many bytes from a 4 MiB buffer:

- ``memcpy``: into anonymous memory already touched (what holding the bytes would cost);
- ``pwrite``, ``/dev/shm``: into a new file of tmpfs, and over the same file's pages again;
- ``pwrite``, the system's temporary directory: the same into its page cache (a disk's file
  system; its dirty pages are written back to the disk later).

Cases alternate their order on each repeat; the table gives each one's median seconds and
GB/s, and writes ``benchmarks/results/page_cache_writes.md`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

BLOCK = 4 * 2**20


def _memcpy(nbytes: int, block: np.ndarray) -> float:
    target = np.empty(nbytes, dtype=np.uint8)
    target[:] = 0  # touched: its pages are mapped before the timer
    start = time.perf_counter()
    for offset in range(0, nbytes, BLOCK):
        target[offset : offset + BLOCK] = block
    return time.perf_counter() - start


def _pwrite(directory: str, nbytes: int, block: np.ndarray, again: bool) -> float:
    """Seconds to write ``nbytes`` to a new file in ``directory`` (``again``: over it)."""
    view = memoryview(block)
    fd, name = tempfile.mkstemp(dir=directory, prefix="page-cache-writes-")
    try:
        for _ in range(2 if again else 1):
            start = time.perf_counter()
            for offset in range(0, nbytes, BLOCK):
                os.pwrite(fd, view, offset)
            seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(name)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results file (Markdown)")
    args = parser.parse_args()
    nbytes = int(args.gigabytes * 1e9) // BLOCK * BLOCK
    block = np.random.default_rng(0).integers(0, 256, BLOCK, dtype=np.uint8)
    temporary = tempfile.gettempdir()
    cases: dict[str, Callable[[], float]] = {
        "memcpy into touched memory": lambda: _memcpy(nbytes, block),
        "pwrite, new file in /dev/shm": lambda: _pwrite("/dev/shm", nbytes, block, False),
        "pwrite, over its pages in /dev/shm": lambda: _pwrite("/dev/shm", nbytes, block, True),
        f"pwrite, new file in {temporary}": lambda: _pwrite(temporary, nbytes, block, False),
        f"pwrite, over its pages in {temporary}": lambda: _pwrite(temporary, nbytes, block, True),
    }
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(args.repeats):
        order = list(cases) if repeat % 2 == 0 else list(reversed(cases))
        for name in order:
            runs[name].append(cases[name]())
            print(f"{repeat} {name}: {runs[name][-1]:.3f} s", flush=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {when} on {platform.node()} ({platform.machine()}, Python "
        f"{platform.python_version()}) with `python benchmarks/page_cache_writes.py "
        f"--gigabytes {args.gigabytes:g} --repeats {args.repeats}`: {nbytes / 1e9:.2f} GB "
        f"written from a 4 MiB buffer in one thread, median of {args.repeats}.",
        "",
        "| case | seconds | GB/s | runs s |",
        "| --- | --- | --- | --- |",
    ]
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        runs_text = ", ".join(f"{s:.3f}" for s in seconds)
        lines.append(f"| {name} | {median:.3f} | {nbytes / 1e9 / median:.1f} | {runs_text} |")
    table = "\n".join(lines)
    print(table)
    out = args.out or Path(__file__).parent / "results" / "page_cache_writes.md"
    out.write_text(table + "\n")


if __name__ == "__main__":
    main()

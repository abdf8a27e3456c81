"""GST3D on one block, one core: the fused kernel against the SciPy pipeline and structure-tensor.

    python benchmarks/gst3d_kernel.py                 # 256^3 float32, Gaussian and d2geo
    python benchmarks/gst3d_kernel.py --size 128 --repeats 5 --out results/gst3d_kernel.md

Each implementation runs in a fresh process pinned to one core (``os.sched_setaffinity``), on
the same smoothed noise: one small warm-up call (the fused kernel's first call loads or
compiles its code), then ``--repeats`` timed calls, in turn with the others (the order
alternates by round). Peak memory is the process's resident high-water mark during one call
(reset first through ``/proc/self/clear_refs``, Linux), less its RSS with the input allocated,
plus the input: bytes per voxel of the whole call, input and output included. Dips are compared
with the SciPy pipeline's (``harness.gst3d_reference``, what ``gst3d_block`` ran before the
fused kernel) at least 9 voxels from the volume's edges, where structure-tensor's boundary
handling differs.

Implementations:

- ``fused``: ``xarray_memchunk.operators.gst3d.fused.gst3d`` (what ``gst3d_block`` runs);
- ``scipy``: the SciPy filters and the slab-wise NumPy eigen-solver (the reference);
- ``structure-tensor``: the PyPI package's ``structure_tensor_3d`` and ``eig_special_3d``
  with the same sigma, rho and truncate (Gaussian kernel only; skipped if not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPLEMENTATIONS = ("fused", "scipy", "structure-tensor")
#: Voxels left out at each edge of the volume when dips are compared (the kernels' halo).
HALO = 9


def _volume(n: int, dtype: str):
    import numpy as np
    from scipy import ndimage

    rng = np.random.default_rng(0)
    return ndimage.gaussian_filter(rng.standard_normal((n, n, n)), 1.0).astype(dtype)


def _function(name: str, kernel: str):
    """``f(x) -> dip`` of one implementation."""
    import numpy as np

    if name == "fused":
        from xarray_memchunk.operators.gst3d.fused import gst3d

        return lambda x: gst3d(x, kernel=kernel)
    if name == "scipy":
        sys.path.insert(0, str(HERE))
        from harness.gst3d_reference import reference

        return lambda x: reference(x, kernel=kernel)
    import structure_tensor

    def peer(x):
        s = structure_tensor.structure_tensor_3d(x, 1.0, 2.0, truncate=3.0)
        _, vectors = structure_tensor.eig_special_3d(s, full=True)
        principal = vectors[0]  # the largest eigenvalue's, components (x, y, z): x the last axis
        z = np.abs(principal[0]) / np.linalg.norm(principal, axis=0)
        return np.degrees(np.arccos(np.clip(z, -1, 1)))

    return peer


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _resident() -> int:
    return _status("VmRSS")


def _high_water_mark() -> int:
    return _status("VmHWM")


def _child(name: str, kernel: str, n: int, dtype: str, repeats: int) -> dict:
    """One implementation in this process: warm-up, timed calls, peak memory, dips."""
    import time

    import numpy as np

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    x = _volume(n, dtype)
    f = _function(name, kernel)
    start = time.perf_counter()
    f(x[:24, :24, :24])
    first = time.perf_counter() - start
    base = _resident()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
    dip = f(x)
    peak = _high_water_mark() - base
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x)
        seconds.append(time.perf_counter() - start)
    np.save(f"/tmp/gst3d_kernel_{name}_{kernel}.npy", np.asarray(dip, dtype=np.float64))
    return {
        "first_s": first,
        "seconds": seconds,
        "bytes_per_voxel": (peak + x.nbytes) / x.size,
    }


def _run_child(name: str, kernel: str, n: int, dtype: str, repeats: int) -> dict | None:
    command = [sys.executable, __file__, "--child", name, "--kernel", kernel]
    command += ["--size", str(n), "--dtype", dtype, "--repeats", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        print(f"{name} {kernel}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="processes per implementation")
    parser.add_argument("--kernel", nargs="*", default=["gaussian", "d2geo"])
    parser.add_argument("--out", help="also write the table (Markdown) here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _child(args.child, args.kernel[0], args.size, args.dtype, args.repeats)
        print(json.dumps(result))
        return

    import numpy as np

    rows = []
    for kernel in args.kernel:
        names = [n for n in IMPLEMENTATIONS if kernel == "gaussian" or n != "structure-tensor"]
        if "structure-tensor" in names:
            try:
                import structure_tensor  # noqa: F401
            except ImportError:
                names.remove("structure-tensor")
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                result = _run_child(name, kernel, args.size, args.dtype, args.repeats)
                if result is not None:
                    runs[name].append(result)
        reference = np.load(f"/tmp/gst3d_kernel_scipy_{kernel}.npy")
        scipy_s = statistics.median(s for r in runs["scipy"] for s in r["seconds"])
        for name in names:
            if not runs[name]:
                rows.append((kernel, name, "failed", "", "", "", "", ""))
                continue
            median = statistics.median(s for r in runs[name] for s in r["seconds"])
            dip = np.load(f"/tmp/gst3d_kernel_{name}_{kernel}.npy")
            edge = (slice(HALO, -HALO),) * 3  # structure-tensor treats the volume's edges apart
            diff = np.abs(dip - reference)[edge]
            rows.append(
                (
                    kernel,
                    name,
                    f"{median:.2f}",
                    f"{args.size**3 / median / 1e6:.1f}",
                    f"{scipy_s / median:.2f}",
                    f"{statistics.median(r['bytes_per_voxel'] for r in runs[name]):.1f}",
                    f"{max(r['first_s'] for r in runs[name]):.2f}",
                    f"{np.nanpercentile(diff, 99):.1e} / {np.nanmax(diff):.1e}",
                )
            )
    header = (
        "| kernel | implementation | s (median) | Mvoxel/s per core | speed-up vs scipy "
        "| peak B/voxel | first call s | dip vs scipy, p99 / max (deg, 9 voxels from the edges) |"
    )
    lines = [
        f"{args.size}^3 {args.dtype}, one core, sigma=1, rho=2, truncate=3; median of "
        f"{args.rounds} processes x {args.repeats} calls "
        f"(`python benchmarks/gst3d_kernel.py --size {args.size} --repeats {args.repeats}`).",
        "",
        header,
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

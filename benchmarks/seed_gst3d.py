"""The seed's GST3D as a user's NumPy function (eigh per voxel, ~240 B/voxel), no model written.

    python benchmarks/seed_gst3d.py                     # 200^3 float32, 2 workers x 1 x 1.5GB

Cases, each on a fresh LocalCluster, runs interleaved, median of ``--repeats``: Dask's auto
chunks, the seed's model-based chunks (159^3, from its XGBoost prediction), manual 100^3, and
memchunk with self-calibration (the calibration's seconds are in "plan s": the first plan
measures the function in a worker; the calibration directory starts empty). Prints a table and
writes it, with the command, to ``benchmarks/results/seed_gst3d_<size>_<limit>.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--memory-limit", default="1.5GB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="memchunk-seed-")

    from xarray_memchunk.demo.experiment import Case, format_table, run_gst3d_experiment
    from xarray_memchunk.demo.seed_gst3d import seed_gst3d

    cases = [  # memchunk first: its first plan is the one that measures the function
        Case("memchunk (self-cal.)", None),
        Case("dask auto", "auto"),
        Case("seed model 159^3", 159),
        Case("manual 100^3", 100),
    ]
    outcomes = run_gst3d_experiment(
        (args.size,) * 3,
        memory_limit=args.memory_limit,
        cases=cases,
        repeats=args.repeats,
        operator=seed_gst3d,
    )
    table = format_table(outcomes, args.memory_limit)
    header = (
        f"seed GST3D (NumPy + eigh, self-calibrating user operator) on {args.size}^3 float32, "
        f"LocalCluster 2 workers x 1 thread x {args.memory_limit}, median of {args.repeats}\n"
        f"command: python {' '.join(sys.argv)}"
    )
    print(header + "\n" + table)
    for o in outcomes:
        print(f"  {o.label}: wall s of each run {o.extra.get('all_seconds', [o.seconds])}")
    out = Path(__file__).parent / "results" / f"seed_gst3d_{args.size}_{args.memory_limit}.txt"
    out.write_text(header + "\n" + table + "\n")


if __name__ == "__main__":
    main()

"""Whether a compressed SVD could read its input once: the one-pass projection's accuracy.

    python benchmarks/svd_one_pass.py                 # 2000 x 5000 float32, k=10, 20 columns
    python benchmarks/svd_one_pass.py --rows 4000 --cols 8000
    python benchmarks/svd_one_pass.py --passes        # and where memchunk's run spends its time

``svd_compressed`` with no power iteration reads its input twice where the workers do not hold
it between passes (:func:`xarray_memchunk.operators.svd.compressed.holds_input`):
``Y = A @ omega`` (then
``Q, R = tsqr(Y)``) and ``B = Q.T @ A``. Where each block holds whole rows, the second read can
be avoided: ``Q.T @ A = R^-T (Y.T @ A)``, and each block's ``Y_i.T @ A_i`` can be summed in the
first pass, beside ``Y_i``. The price is accuracy: the solve by ``R`` multiplies the rounding
of ``Y.T @ A`` (float32) by up to ``cond(R)``.

For matrices of four spectra (in float32, the singular values of a float64 copy as the truth),
this prints ``cond(R)`` and the largest error of the top ``k`` singular values, relative to the
first, of: the two-pass algorithm against the truth; the one-pass projection against the
two-pass one; and the one-pass projection keeping only the directions of ``R`` whose singular
values are above ``--keep`` of the largest. NumPy on one process; nothing of memchunk runs
(the experiment behind a possible algorithm, not the library's).

``--passes``: memchunk's compressed SVD of ``floors.py``'s wide matrix (8000 x 30000 float32,
chunks of 1000 rows, ``k=10``, no power iteration) on fresh ``LocalCluster`` s of 2 workers x 1
thread x 1 GB, 3 runs: its wall time and the task seconds of each pass over the input: the
graph's ``sum`` layers of as many tasks as the input has blocks that take time, in the order
the task stream first names them.
"""

from __future__ import annotations

import argparse
import collections
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SPECTRA = ("rank 20 + noise 0.1", "0.7^j", "0.3^j", "rank 5, no noise")


def matrix(spectrum: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """A float32 matrix of ``spectrum`` (60 singular values where not rank 20 plus noise)."""
    if spectrum == "rank 20 + noise 0.1":
        low = rng.standard_normal((rows, 20)) @ rng.standard_normal((20, cols))
        return (low + 0.1 * rng.standard_normal((rows, cols))).astype(np.float32)
    left, _ = np.linalg.qr(rng.standard_normal((rows, 60)))
    right, _ = np.linalg.qr(rng.standard_normal((cols, 60)))
    values = {
        "0.7^j": 0.7 ** np.arange(60),
        "0.3^j": 0.3 ** np.arange(60),
        "rank 5, no noise": np.r_[np.ones(5), np.zeros(55)],
    }[spectrum]
    return ((left * values) @ right.T).astype(np.float32)


def errors(a: np.ndarray, k: int, columns: int, keep: float, rng: np.random.Generator) -> dict:
    """``cond(R)`` and the relative errors of the top ``k`` singular values of each way."""
    omega = rng.standard_normal((a.shape[1], columns)).astype(np.float32)
    y = a @ omega
    q, r = np.linalg.qr(y)
    two_pass = np.linalg.svd(q.T @ a, compute_uv=False)[:k]
    projected = (y.T @ a).astype(np.float64)  # summed over row blocks in the first pass
    one_pass = np.linalg.svd(np.linalg.solve(r.T.astype(np.float64), projected), compute_uv=False)
    _, values, right = np.linalg.svd(r.astype(np.float64))
    kept = values > keep * values[0]
    # R^-T = U S^-1 V^T: the rows S^-1 V^T (Y.T A), rotated by U, where S is large enough
    truncated = np.linalg.svd((right[kept].T / values[kept]).T @ projected, compute_uv=False)
    truth = np.linalg.svd(a.astype(np.float64), compute_uv=False)[:k]

    def worst(values: np.ndarray, against: np.ndarray) -> float:
        padded = np.zeros(k)
        padded[: min(k, len(values))] = values[:k]
        return float(np.max(np.abs(padded - against)) / truth[0])

    return {
        "cond": float(np.linalg.cond(r.astype(np.float64))),
        "two-pass vs truth": worst(two_pass, truth),
        "one-pass vs two-pass": worst(one_pass, two_pass),
        "kept directions vs two-pass": worst(truncated, two_pass),
    }


def passes(runs: int = 3) -> None:
    """Print memchunk's compressed SVD runs on the wide matrix: wall time and seconds per pass."""
    import xarray as xr
    from distributed import get_task_stream
    from floors import COMPONENTS, _import_libraries
    from harness.fresh import fresh_client
    from peers import make_matrix

    import xarray_memchunk  # noqa: F401 (the accessor)

    print("\n| run | wall s | passes over the input: tasks, task seconds (summed) |")
    print("| --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="memchunk-svd-") as tmp:
        wide = make_matrix(Path(tmp), "wide", 1.0)
        for run in range(runs):
            with fresh_client(2, 1, "1GB") as client:
                client.run(_import_libraries)
                field = xr.open_zarr(wide)["field"]
                kwargs = {"sample_dims": ("time",), "k": COMPONENTS, "n_power_iter": 0}
                start = time.perf_counter()
                with get_task_stream(client) as stream:
                    field.memchunk.apply("svd", **kwargs)["S"].load()
                wall = time.perf_counter() - start
            layers: dict[str, list[float]] = collections.defaultdict(list)
            for task in stream.data:
                key = task["key"]
                name = key[0] if isinstance(key, tuple) else key
                if not name.startswith("sum-") or "partial" in name:
                    continue
                seconds = sum(
                    s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute"
                )
                layers[name].append(seconds)
            blocks = len(field.chunks[0])
            # a pass reads every block: a layer of one task per block that does work
            found = [v for v in layers.values() if len(v) == blocks and sum(v) > 0.05]
            if not found:
                raise RuntimeError(f"no layer of {blocks} sum tasks: Dask's keys changed")
            text = "; ".join(f"{len(v)} tasks, {sum(v):.2f} s" for v in found)
            print(f"| {run + 1} | {wall:.2f} | {text} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--cols", type=int, default=5000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--oversamples", type=int, default=10)
    parser.add_argument("--keep", type=float, default=1e-4, help="of R's largest singular value")
    parser.add_argument("--passes", action="store_true", help="and time memchunk's two passes")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"`python {' '.join(sys.argv)}` (Python {platform.python_version()}, numpy "
        f"{np.__version__}): {args.rows} x {args.cols} float32, k={args.k}, "
        f"{args.k + args.oversamples} columns in Y; errors relative to the first singular value.\n"
    )
    print("| spectrum | cond(R) | two-pass vs truth | one-pass vs two-pass | kept vs two-pass |")
    print("| --- | --- | --- | --- | --- |")
    for spectrum in SPECTRA:
        a = matrix(spectrum, args.rows, args.cols, rng)
        e = errors(a, args.k, args.k + args.oversamples, args.keep, rng)
        print(
            f"| {spectrum} | {e['cond']:.1e} | {e['two-pass vs truth']:.1e} | "
            f"{e['one-pass vs two-pass']:.1e} | {e['kept directions vs two-pass']:.1e} |"
        )
    if args.passes:
        passes()


if __name__ == "__main__":  # --passes starts clusters: the guard their processes need
    main()

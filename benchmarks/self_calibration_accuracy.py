"""How accurate is a model that a user function measured itself? Held-out shapes, in a worker.

    python benchmarks/self_calibration_accuracy.py

The seed's GST3D (NumPy + eigh per voxel) calibrates itself as its first plan does, on a
200^3 float32 volume for 2 workers x 1.5GB (a fresh calibration directory), and the time it
takes is printed. Then blocks it did not measure run in a worker as calibration runs them:
shapes within the range it trusts (where plans go), and beyond it (where they do not go: the
numbers show what extrapolating would have risked). The table gives predicted and measured
peaks and the error, per shape, then the median absolute error and the worst under-prediction
of each group.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


def main() -> None:
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="memchunk-selfcal-")
    import dask
    from distributed import Client, LocalCluster

    from xarray_memchunk.datasets import synthetic_seismic
    from xarray_memchunk.demo.seed_gst3d import seed_gst3d
    from xarray_memchunk.measure.calibrate import features_of, run_task
    from xarray_memchunk.measure.self_calibration import self_calibrate
    from xarray_memchunk.memory_limits import resolve_budget
    from xarray_memchunk.models import load_calibration
    from xarray_memchunk.models.fitting import prediction_errors
    from xarray_memchunk.models.profiling import profile_in_worker

    # a 1.5 GB worker of 1 thread: with no cluster, a memory_limit is shared by the threaded
    # scheduler's threads (num_workers)
    dask.config.set({"num_workers": 1})
    volume = synthetic_seismic((200, 200, 200), chunks="auto").amplitude
    kwargs = seed_gst3d.check_arguments({})
    calibration = self_calibrate(seed_gst3d, volume, kwargs, resolve_budget("1.5GB").per_task)
    print(calibration.explain())
    model = load_calibration(seed_gst3d.calibration, "cpu", "float32").model
    largest = calibration.largest_elements
    blocks = [
        (40, 50, 60),
        (50, 80, 100),
        (64, 64, 110),
        (60, 90, 110),
        (120, 80, 70),
        (100, 100, 90),
        (150, 60, 90),
        (140, 140, 140),
        (180, 160, 150),
        (200, 200, 200),
    ]
    trusted = calibration.trusted_elements
    shapes = {  # where plans go, and where they do not (what extrapolating would have risked)
        "within": [b for b in blocks if np.prod(b) <= trusted],
        "beyond": [b for b in blocks if np.prod(b) > trusted],
    }
    dims = ("inline", "crossline", "sample")
    print(f"largest block measured: {largest:,} elements; plans go up to {trusted:,}")
    print(
        f"{'group':<7} {'block':<12} {'elements':>10} {'measured MB':>12} "
        f"{'predicted MB':>13} {'error %':>8}"
    )
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit=0, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        for group, blocks in shapes.items():
            measured, predicted = [], []
            for block in blocks:
                extents = dict(zip(dims, block, strict=True))
                case = (extents, extents, (seed_gst3d, kwargs, extents, extents, "float32"))
                (profile,) = profile_in_worker(client, run_task, [case], "float32", repeats=2)
                features = features_of(seed_gst3d, extents, "float32", kwargs)
                guess = float(model.peak_bytes({k: np.array([v]) for k, v in features.items()})[0])
                measured.append(profile.peak_bytes)
                predicted.append(guess)
                error = 100 * (guess - profile.peak_bytes) / profile.peak_bytes
                print(
                    f"{group:<7} {'x'.join(map(str, block)):<12} {np.prod(block):>10,} "
                    f"{profile.peak_bytes / 1e6:>12.1f} {guess / 1e6:>13.1f} {error:>8.1f}",
                    flush=True,
                )
            errors = prediction_errors(np.array(predicted), np.array(measured))
            print(
                f"  {group}: median |error| {errors['median_abs_pct_error']:.1f}%, worst "
                f"under-prediction {errors['worst_under_pct']:.1f}%"
            )


if __name__ == "__main__":
    main()

"""Recalibrate every built-in operator and write the calibrations shipped with the package.

    python benchmarks/calibrate_shipped.py            # all, float32 and float64, 3 repeats
    python benchmarks/calibrate_shipped.py --only laplacian   # one calibration file
    python benchmarks/calibrate_shipped.py --device gpu   # the GPU calibrations, on a GPU

The operators are the built-in ones (``BUILTINS`` of the modules in
``xarray_memchunk/operators/``), each with its ``shipped_calibrations`` argument sets: a new
built-in operator is calibrated here without being listed.

Maintainers run this on a quiet machine and commit ``xarray_memchunk/models/calibrations/``.
Users calibrate their own machine with ``memchunk calibrate OP`` instead.
"""

from __future__ import annotations

import argparse
import time

from distributed import Client, LocalCluster

from xarray_memchunk.measure.calibrate import calibrate, calibration_key
from xarray_memchunk.models.calibration import shipped_dir
from xarray_memchunk.operators import Operator
from xarray_memchunk.operators.registry import builtin_operators


def shipped(device: str) -> list[tuple[Operator, dict, str]]:
    """``(operator, arguments, calibration key)`` of every shipped calibration on ``device``."""
    return [
        (op, dict(kwargs), calibration_key(op, kwargs))
        for op in builtin_operators()
        if device in op.devices
        for kwargs in op.shipped_calibrations
    ]


def scaled(shape, factor: int):
    """A calibration shape (extents, or (extents, sizes)) with every dim ``factor`` x longer."""
    if isinstance(shape, tuple):
        return tuple({d: n * factor for d, n in part.items()} for part in shape)
    return {d: n * factor for d, n in shape.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="calibration names to redo, e.g. svd-compressed")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--output-dir", help="default: the package's shipped calibrations")
    parser.add_argument(
        "--scale",
        type=int,
        default=None,
        help="multiply every dim of the operators' shapes (default: 1 on cpu, 2 on gpu, whose "
        "tasks are planned larger)",
    )
    args = parser.parse_args()
    calibrations = shipped(args.device)
    unknown = sorted(set(args.only or ()) - {key for _, _, key in calibrations})
    if unknown:
        parser.error(
            f"no shipped {args.device} calibration named {unknown}; known: "
            f"{', '.join(key for _, _, key in calibrations)}"
        )
    print(
        f"{'operator':<14} {'dtype':<8} {'shapes':>6} {'median |err| %':>15} "
        f"{'worst under %':>14} {'worst over %':>13} {'seconds':>8}"
    )
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit=0, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        for operator, kwargs, label in calibrations:
            if args.only and label not in args.only:
                continue
            _, default_shapes = operator.calibration_setup(**kwargs)
            start = time.perf_counter()
            scale = args.scale or (2 if args.device == "gpu" else 1)
            shapes = [scaled(s, scale) for s in default_shapes]
            fits = calibrate(
                operator,
                repeats=args.repeats,
                client=client,
                directory=args.output_dir or shipped_dir(),
                device=args.device,
                shapes=shapes,
                **kwargs,
            )
            for dtype, fit in fits.items():
                s = fit["fit"]
                print(
                    f"{label:<14} {dtype:<8} {s['n_profiles']:>6} "
                    f"{s['median_abs_pct_error']:>15.1f} {s['worst_under_pct']:>14.1f} "
                    f"{s['worst_over_pct']:>13.1f} {time.perf_counter() - start:>8.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()

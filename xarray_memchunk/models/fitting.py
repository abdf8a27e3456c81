"""Fit a conservative linear memory model to measured task peaks with scikit-learn."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ABSOLUTE_SLACK",
    "UNDER_TOLERANCE",
    "LinearFit",
    "fit_linear",
    "import_fitting_in_background",
    "prediction_errors",
    "time_per_element",
]

#: Largest under-prediction (fraction of the measurement) left on the fitted profiles.
UNDER_TOLERANCE = 0.03
#: Under-predictions smaller than this many bytes are measurement noise (page granularity,
#: allocator arenas: repeated runs of a 3 MB task spread over 1.3 MB) and lift nothing.
ABSOLUTE_SLACK = 4 * 2**20


@dataclass(frozen=True)
class LinearFit:
    """Coefficients of ``peak = intercept + sum(coef * feature)`` and how well they fit.

    Attributes
    ----------
    coefficients, intercept
        The model, the intercept already lifted by ``lift``.
    lift
        Bytes added to the intercept so that the small profiles are covered.
    median_abs_pct_error, worst_under_pct, worst_over_pct
        Errors on the profiles used in the fit, after the lift (percent).
    n_profiles
        Profiles fitted.
    """

    coefficients: dict[str, float]
    intercept: float
    lift: float
    median_abs_pct_error: float
    worst_under_pct: float
    worst_over_pct: float
    n_profiles: int

    def predict(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted peak bytes for these features."""
        total = np.full(len(next(iter(features.values()))), self.intercept, dtype=np.float64)
        for name, coef in self.coefficients.items():
            total += coef * np.asarray(features[name], dtype=np.float64)
        return total


def prediction_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Median absolute, worst under- and worst over-prediction, in percent of the measurement.

    Under-prediction is reported as a positive number: 12.0 means a prediction 12% below what
    was measured. A measurement under :data:`ABSOLUTE_SLACK` (a tiny task can measure 0 bytes:
    its memory was mapped already) is compared as that much, noise being no finer.
    """
    measured = np.asarray(measured, float)
    pct = 100.0 * (np.asarray(predicted, float) - measured) / np.maximum(measured, ABSOLUTE_SLACK)
    return {
        "median_abs_pct_error": float(np.median(np.abs(pct))),
        "worst_under_pct": float(max(0.0, -pct.min())),
        "worst_over_pct": float(max(0.0, pct.max())),
    }


def _import_fitting() -> None:
    try:
        from sklearn.linear_model import LinearRegression  # noqa: F401
    except ImportError:  # fit_linear raises it where it is needed
        pass


def import_fitting_in_background() -> None:
    """Start importing what :func:`fit_linear` needs (scikit-learn) in a thread of its own.

    The import takes about 1 s (scikit-learn brings ``scipy.stats``). Self-calibration starts
    it before measuring, where the blocks run in another process: this process only waits for
    them meanwhile. :func:`fit_linear` imports as usual; a Python import still under way in
    another thread is waited for, not run twice. Nothing is started where it is imported
    already.
    """
    if "sklearn.linear_model" not in sys.modules:
        threading.Thread(target=_import_fitting, name="memchunk-import-sklearn").start()


def fit_linear(features: Mapping[str, np.ndarray], peaks: np.ndarray) -> LinearFit:
    """Fit a linear upper bound of task peaks that stays safe beyond the profiled shapes.

    1. The coefficients come from the **larger half** of the profiles (by peak), with
       scikit-learn's ``LinearRegression(positive=True)`` weighted by ``1 / peak`` (a peak
       under :data:`ABSOLUTE_SLACK`, 0 bytes included, weighs as that much). That is the
       regime plans are made in, and its slope is the one that extrapolates: a task's peak is
       often the maximum of phases (GST3D: the tensor phase for large blocks, the eigen-solver's
       fixed slab buffers for small ones), a convex curve that any line fitted across the
       whole range, or drawn as a chord, under-predicts beyond the largest profile.
    2. The constant is then lifted until no profile is under-predicted by more than
       :data:`UNDER_TOLERANCE` plus :data:`ABSOLUTE_SLACK` bytes, which covers the small tasks'
       fixed costs without bending the slope. A model that under-predicts is the one that
       kills workers; the per-task budget keeps a further reserve
       (:mod:`~xarray_memchunk.memory_limits`).

    Non-negative coefficients keep predictions growing with the task.

    Parameters
    ----------
    features
        Feature name -> one value per profile.
    peaks
        Measured peak bytes, one per profile.
    """
    from sklearn.linear_model import LinearRegression

    names = list(features)
    x = np.column_stack([np.asarray(features[n], dtype=np.float64) for n in names])
    y = np.asarray(peaks, dtype=np.float64)
    large = y >= np.median(y)
    scale = np.maximum(np.abs(x).max(axis=0), 1.0)  # conditioning: features span many decades
    reg = LinearRegression(positive=True).fit(
        x[large] / scale, y[large], sample_weight=1.0 / np.maximum(y[large], ABSOLUTE_SLACK)
    )
    coefficients = reg.coef_ / scale
    intercept = max(0.0, float(reg.intercept_))
    fitted = intercept + x @ coefficients
    lift = max(0.0, float(np.max(y * (1.0 - UNDER_TOLERANCE) - ABSOLUTE_SLACK - fitted)))
    intercept += lift
    errors = prediction_errors(intercept + x @ coefficients, y)
    return LinearFit(
        coefficients={n: float(c) for n, c in zip(names, coefficients, strict=True)},
        intercept=intercept,
        lift=lift,
        n_profiles=len(y),
        **errors,
    )


def time_per_element(
    elements: np.ndarray, seconds: np.ndarray, works: np.ndarray | None = None
) -> tuple[float, float | None]:
    """The median time per element of the larger half of some tasks, and the work it is at.

    Small tasks are dominated by fixed costs, so only the tasks of at least the median number
    of elements count.

    Parameters
    ----------
    elements, seconds
        Elements and measured seconds of each task.
    works
        The operator's work per element in each task
        (:attr:`~xarray_memchunk.operators.base.Cost.work_per_element`), where it depends on
        the array.

    Returns
    -------
    tuple
        ``(seconds_per_element, work_per_element)``: the work is the median time per element
        over the median time per element and unit of work (so that their ratio is the
        latter); None without ``works``, or where no task took any time.
    """
    elements, seconds = np.asarray(elements, float), np.asarray(seconds, float)
    large = elements >= np.median(elements)
    per_element = seconds[large] / elements[large]
    median = float(np.median(per_element))
    if works is None:
        return median, None
    per_work = float(np.median(per_element / np.asarray(works, float)[large]))
    return median, median / per_work if per_work > 0 else None

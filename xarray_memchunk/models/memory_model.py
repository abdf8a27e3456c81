"""Memory models: predicted peak bytes of one task from features of its shape."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import CalibrationError

__all__ = ["LinearMemoryModel"]


def _non_negative(value: object, what: str, source: str) -> None:
    """Refuse a term that is not a finite, non-negative real number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
    ):
        raise CalibrationError(
            f"memory model ({source}): {what} must be a finite number >= 0, got {value!r}; a "
            f"negative or infinite term would plan a peak no task has"
        )


@dataclass(frozen=True)
class LinearMemoryModel:
    """Peak bytes linear in the task's features: ``intercept + sum(coef[f] * features[f])``.

    Linear forms extrapolate: a task twice as large is predicted to need twice the
    per-element memory, unlike a tree model whose prediction stays flat past the largest
    profiled shape.

    Parameters
    ----------
    coefficients
        Bytes per unit of each feature, e.g. ``{"input_bytes": 12.0}`` for a task whose
        temporaries are 12 times its (padded) input.
    intercept
        Fixed bytes per task (buffers, scratch slabs), independent of the chunk size.
    source
        Where the numbers came from (``"analytic"``, or the calibration file).

    Raises
    ------
    CalibrationError
        When a feature name is not a string, or a coefficient or the intercept is not a
        finite, non-negative number: the model never predicts a negative peak.
    """

    coefficients: Mapping[str, float]
    intercept: float = 0.0
    source: str = "analytic"

    def __post_init__(self) -> None:
        for name, coef in self.coefficients.items():
            if not isinstance(name, str):
                raise CalibrationError(
                    f"memory model ({self.source}): feature names are strings, got {name!r}"
                )
            _non_negative(coef, f"coefficient of {name!r}", self.source)
        _non_negative(self.intercept, "intercept", self.source)

    def check_features(self, produced: Iterable[str]) -> None:
        """Refuse features the model needs and the operator does not produce.

        Parameters
        ----------
        produced
            Names of the features the operator gives for a task.

        Raises
        ------
        CalibrationError
            Naming the model's source and the missing features.
        """
        produced = set(produced)
        unknown = sorted(set(self.coefficients) - produced)
        if unknown:
            raise CalibrationError(
                f"memory model ({self.source}) needs features {unknown}, which the operator "
                f"does not produce (it gives {sorted(produced)}); delete that calibration or "
                f"calibrate the operator again, or give a model of the operator's features"
            )

    def peak_bytes(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted peak bytes of one task, per candidate.

        ``features`` maps feature names to arrays of the same length, one entry per candidate
        task shape; the result has that length too.

        Raises
        ------
        CalibrationError
            When the model needs a feature that ``features`` lacks.
        """
        self.check_features(features)
        total = np.asarray(self.intercept, dtype=np.float64)
        for name, coef in self.coefficients.items():
            total = total + coef * np.asarray(features[name], dtype=np.float64)
        return np.ceil(total)

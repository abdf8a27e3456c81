"""Memory models: predicted peak bytes of one task from features of its shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["LinearMemoryModel"]


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
    """

    coefficients: Mapping[str, float]
    intercept: float = 0.0
    source: str = "analytic"

    def peak_bytes(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted peak bytes of one task, per candidate.

        ``features`` maps feature names to arrays of the same length, one entry per candidate
        task shape; the result has that length too.
        """
        total = np.asarray(self.intercept, dtype=np.float64)
        for name, coef in self.coefficients.items():
            if name not in features:
                raise KeyError(
                    f"memory model needs feature {name!r}; the operator gave {sorted(features)}"
                )
            total = total + coef * np.asarray(features[name], dtype=np.float64)
        return np.ceil(total)

"""Memory models of operator tasks: analytic linear forms, calibrated under Dask, stored as JSON."""

from .calibration import Calibration, calibration_dir, load_calibration, save_calibration
from .memory_model import LinearMemoryModel

__all__ = [
    "Calibration",
    "LinearMemoryModel",
    "calibration_dir",
    "load_calibration",
    "save_calibration",
]

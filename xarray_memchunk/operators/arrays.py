"""Which array library a block belongs to: NumPy on the CPU, CuPy on a GPU.

Operators write their block functions once, against ``xp`` (the array namespace), and get it
from the block itself.
CuPy is imported only when a block is a CuPy array.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["array_module", "is_cupy", "to_numpy"]


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(x: Any) -> ModuleType:
    """``cupy`` for a CuPy array, else ``numpy``."""
    if is_cupy(x):
        import cupy

        return cupy
    return np


def to_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array, copied from the device for a CuPy array."""
    return x.get() if is_cupy(x) else np.asarray(x)

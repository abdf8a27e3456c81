"""SVD of a 2-D array along its long dim: one module per algorithm, chosen by ``method="auto"``."""

from .operator import SVD

__all__ = ["SVD"]

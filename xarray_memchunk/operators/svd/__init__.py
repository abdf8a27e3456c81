"""SVD of a 2-D array along its long dim: one module per algorithm, chosen by ``method="auto"``."""

from .operator import SVD

__all__ = ["SVD"]

#: Registered as built-in operators (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (SVD(),)

"""GST3D: gradient structure tensor to dip and azimuth, fused into one task per chunk.

:mod:`~.operator` is the operator (dims, memory model, lazy computation); :mod:`~.kernels` the
block kernel for NumPy and CuPy blocks; :mod:`~.fused` the compiled (Numba) CPU kernel;
:mod:`~.gpu` the CuPy elementwise kernel of the eigen-analysis.
"""

from .operator import GST3D

__all__ = ["GST3D"]

#: Registered as built-in operators (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (GST3D(),)

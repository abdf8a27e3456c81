"""GST3D: gradient structure tensor to dip and azimuth, fused into one task per chunk.

:mod:`~.operator` is the operator (dims, memory model, lazy computation); :mod:`~.kernels` the
NumPy/CuPy block kernels; :mod:`~.gpu` the CuPy elementwise kernel; :mod:`~.eigen` the
closed-form eigen-solver of 3 x 3 symmetric tensors.
"""

from .operator import GST3D

__all__ = ["GST3D"]

#: Registered as built-in operators (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (GST3D(),)

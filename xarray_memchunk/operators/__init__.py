"""Operators: what dims they need, their cost (memory models), and their lazy computations.

Built-in operators are the ``BUILTINS`` of the modules and packages in this folder, registered
when it is imported (:func:`~xarray_memchunk.operators.registry.load_builtins`): a new one is a
new module here, listed nowhere else.
"""

from .base import Cost, DimUse, Operator, input_output_features
from .blockwise import BlockwiseOperator
from .decorator import operator
from .gst3d import GST3D
from .reductions import Reduction
from .registry import get_operator, load_builtins, operator_names, register_operator
from .svd import SVD
from .xarray_function import XarrayFunctionOperator

__all__ = [
    "BlockwiseOperator",
    "Cost",
    "DimUse",
    "GST3D",
    "Operator",
    "Reduction",
    "SVD",
    "XarrayFunctionOperator",
    "get_operator",
    "input_output_features",
    "operator",
    "operator_names",
    "register_operator",
]

load_builtins(__name__, __path__)

"""Operators: what dims they need, their cost (memory models), and their lazy computations."""

from .base import Cost, DimUse, Operator, input_output_features
from .blockwise import BlockwiseOperator, operator
from .gst3d import GST3D
from .reductions import REDUCTIONS, Reduction
from .registry import get_operator, operator_names, register_builtins, register_operator
from .svd import SVD

__all__ = [
    "BlockwiseOperator",
    "Cost",
    "DimUse",
    "GST3D",
    "Operator",
    "Reduction",
    "SVD",
    "get_operator",
    "input_output_features",
    "operator",
    "operator_names",
    "register_operator",
]

register_builtins((*REDUCTIONS, GST3D(), SVD()))

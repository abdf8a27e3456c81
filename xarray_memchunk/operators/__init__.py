"""Operators: what dims they need, their memory models, and their lazy computations."""

from .base import DimUse, Operator, TaskModel
from .blockwise import BlockwiseOperator
from .gst3d import GST3D
from .reductions import REDUCTIONS, Reduction
from .registry import get_operator, operator_names, register_operator

__all__ = [
    "BlockwiseOperator",
    "DimUse",
    "GST3D",
    "Operator",
    "Reduction",
    "TaskModel",
    "get_operator",
    "operator_names",
    "register_operator",
]

for _op in (*REDUCTIONS, GST3D()):
    register_operator(_op)

"""xarray-memchunk: memory-aware chunking for xarray + Dask.

Importing the package registers the ``.memchunk`` accessor on :class:`xarray.Dataset` and
:class:`xarray.DataArray`::

    import xarray_memchunk
    plan = ds.memchunk.plan("gst3d")   # chunks, predicted peak per task, and why
    dip = ds.memchunk.apply("gst3d")   # lazy result, rechunked per the plan
"""

from .accessor import MemchunkAccessor, register
from .api import Plan, apply, plan
from .errors import (
    BudgetError,
    CalibrationError,
    DimensionError,
    InfeasiblePlanError,
    MemchunkError,
    MemoryBudgetWarning,
    UnknownOperatorError,
)
from .measure.calibrate import calibrate, self_calibrate
from .measure.runs import RunReport
from .memory_limits import Budget, resolve_budget
from .models import LinearMemoryModel
from .operators import (
    BlockwiseOperator,
    DimUse,
    Operator,
    operator,
    operator_names,
    register_operator,
)
from .planning.plan import ChunkPlan
from .planning.problem import DimRole

__version__ = "0.1.0"

__all__ = [
    "BlockwiseOperator",
    "Budget",
    "BudgetError",
    "CalibrationError",
    "ChunkPlan",
    "DimRole",
    "DimUse",
    "DimensionError",
    "InfeasiblePlanError",
    "LinearMemoryModel",
    "MemchunkAccessor",
    "MemchunkError",
    "MemoryBudgetWarning",
    "RunReport",
    "Operator",
    "Plan",
    "UnknownOperatorError",
    "apply",
    "calibrate",
    "operator",
    "operator_names",
    "plan",
    "register_operator",
    "resolve_budget",
    "self_calibrate",
]

register()

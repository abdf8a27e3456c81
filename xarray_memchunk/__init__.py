"""xarray-memchunk: memory-aware chunking for xarray + Dask.

Importing the package registers the ``.memchunk`` accessor on :class:`xarray.Dataset` and
:class:`xarray.DataArray`::

    import xarray_memchunk
    plan = ds.memchunk.plan("gst3d")   # chunks, predicted peak per task, and why
    dip = plan.apply()                 # lazy result, rechunked per that plan
    dip = ds.memchunk.apply("gst3d")   # the same in one step
"""

from ._version import __version__ as __version__
from .accessor import MemchunkAccessor, register
from .api import Plan, apply, plan, report
from .errors import (
    BudgetError,
    CalibrationError,
    DimensionError,
    InfeasiblePlanError,
    MeasuringWorkerDiedError,
    MemchunkError,
    MemoryBudgetWarning,
    NoRoomForTaskError,
    ResultGatherWarning,
    UnknownOperatorError,
)
from .measure.calibrate import calibrate
from .measure.runs import RunReport
from .measure.self_calibration import self_calibrate
from .memory_limits import Budget, resolve_budget
from .models import LinearMemoryModel
from .operators import (
    BlockwiseOperator,
    Cost,
    DimUse,
    Operator,
    XarrayFunctionOperator,
    input_output_features,
    operator,
    operator_names,
    register_operator,
)
from .operators.staged_stores import remove_staged_stores
from .planning.plan import ChunkPlan
from .planning.problem import DimRole

__all__ = [
    "BlockwiseOperator",
    "Budget",
    "BudgetError",
    "CalibrationError",
    "ChunkPlan",
    "Cost",
    "DimRole",
    "DimUse",
    "DimensionError",
    "InfeasiblePlanError",
    "LinearMemoryModel",
    "MeasuringWorkerDiedError",
    "MemchunkAccessor",
    "MemchunkError",
    "MemoryBudgetWarning",
    "NoRoomForTaskError",
    "ResultGatherWarning",
    "RunReport",
    "Operator",
    "Plan",
    "UnknownOperatorError",
    "XarrayFunctionOperator",
    "apply",
    "calibrate",
    "input_output_features",
    "operator",
    "operator_names",
    "plan",
    "register_operator",
    "remove_staged_stores",
    "report",
    "resolve_budget",
    "self_calibrate",
]

register()

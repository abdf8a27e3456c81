"""Exceptions and warnings raised by xarray-memchunk.

Every error derives from :class:`MemchunkError`, and every one is raised before any
computation starts: planning and validation run on metadata only.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any


class MemchunkError(Exception):
    """Base class of every error raised by xarray-memchunk."""


class UnknownOperatorError(MemchunkError, KeyError):
    """An operator name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DimensionError(MemchunkError, ValueError):
    """A dimension the operator needs is missing, or was named ambiguously."""


class BudgetError(MemchunkError, ValueError):
    """A memory budget that cannot be parsed, is zero or negative, or leaves no room for a task.

    Attributes
    ----------
    minimum_memory_limit
        Where the workers' memory leaves no room for a task: the least worker ``memory_limit``
        (bytes) the message states, at the same threads per worker. From ``plan``, the least
        at which the operator's plan runs; from a budget alone (``resolve_budget``), the least
        that leaves a task room. None for a budget that could not be read.
    reason
        Where the workers' memory leaves no room for a task: what leaves none (the memory
        Dask pauses at, what a worker already holds), without the advice; else empty.
    budget_at_minimum
        Where the workers' memory leaves no room for a task: the :class:`Budget` of a worker
        with the least memory that has room, which planning asks whether the operator needs
        more; else None.
    """

    def __init__(
        self, message: str, *, minimum_memory_limit: int | None = None, reason: str = ""
    ) -> None:
        super().__init__(message)
        self.minimum_memory_limit = minimum_memory_limit
        self.reason = reason
        self.budget_at_minimum: Any = None


class InfeasiblePlanError(MemchunkError):
    """No chunking of the data lets one task fit in the per-task memory budget.

    Attributes
    ----------
    minimum_memory_limit
        The least worker ``memory_limit`` (bytes) at which the plan runs, at the same threads
        per worker, as the message states it; None where it states none (a per-task budget
        given by hand, a model measured on too small tasks).
    """

    def __init__(
        self,
        message: str,
        *,
        minimum_memory_limit: int | None = None,
    ) -> None:
        super().__init__(message)
        self.minimum_memory_limit = minimum_memory_limit


class NoRoomForTaskError(BudgetError, InfeasiblePlanError):
    """``plan``'s refusal where the budget itself leaves no room for a task.

    What the workers (or this process) hold is past Dask's pause line before any task. A
    :class:`BudgetError` (the budget leaves nothing) and an :class:`InfeasiblePlanError`
    (nothing fits), so that ``except InfeasiblePlanError`` catches every refusal that states a
    minimum: a new user's script caught a plan refused on workers of its own process as
    ``BudgetError`` only, and crashed. ``minimum_memory_limit`` is the least memory at which the
    plan runs. A refusal found while planning (what running the operator leaves in a worker)
    is an :class:`InfeasiblePlanError`.
    """


class CalibrationError(MemchunkError):
    """A calibration file that is missing, malformed, or does not match its operator."""


class MeasuringWorkerDiedError(CalibrationError):
    """The process measuring an operator's tasks died (its memory, a signal) before answering."""


class MemoryBudgetWarning(UserWarning):
    """A plan made other than asked, for memory.

    User-given chunks whose predicted peak per task exceeds the per-task budget, or a
    ``memory_limit`` above what the active cluster's workers have (theirs is used).
    """


class ResultGatherWarning(UserWarning):
    """A result too large to gather into one worker, as ``.compute()`` does.

    The plan bounds the operator's tasks; Dask's last task of ``.compute()`` concatenates the
    whole result on one worker, and before it the finished pieces wait beside the tasks still
    running (all of them in this process, with no cluster). Given when such a result is
    computed (``.compute()``, ``.values``, ``.load()``, ``dask.compute``), once; written
    (``result.memchunk.to_zarr``), nothing is gathered and it gives none. Not a
    :class:`MemoryBudgetWarning`: the plan is as asked.
    """


def warn_at_caller(message: str, category: type[Warning], *, past: tuple[str, ...] = ()) -> None:
    """Warn with ``message``, pointing at the first caller outside this package.

    ``past``: the names of other packages whose frames are passed over too (``"dask"``, for a
    warning given while Dask computes), where they are imported.
    """
    roots = [os.path.dirname(os.path.abspath(__file__))]
    for name in past:
        module = sys.modules.get(name)
        if getattr(module, "__file__", None):
            roots.append(os.path.dirname(os.path.abspath(module.__file__)))
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(tuple(roots)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

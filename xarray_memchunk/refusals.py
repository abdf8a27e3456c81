"""Refusals that state the least memory a plan runs at, and say it once.

A plan refused for memory states a minimum ``memory_limit``. Where that minimum is only room
for a task, the plan is made again there (:func:`least_memory_that_plans`, through the
caller's ``replan``) and the refusal states the least memory that plans; the figure leads the
message (:func:`minimum_first`), with an allowance for a baseline that moves between plans.
"""

from __future__ import annotations

import contextvars
import math
import re
import warnings
from collections.abc import Callable
from typing import TypeVar

from . import memory_limits
from .errors import (
    BudgetError,
    CalibrationError,
    InfeasiblePlanError,
    MemchunkError,
    NoRoomForTaskError,
)
from .memory_limits import Budget, budget_with_memory
from .operators import Operator
from .planning.budget import format_size

__all__ = [
    "MINIMUM_SEARCH_STEPS",
    "Replan",
    "checked_minimum",
    "least_memory_that_plans",
    "minimum_first",
    "refusal_for_no_room",
]

#: Plans the operator again at a budget, with ``measure=`` as given; raises where refused.
Replan = Callable[[Budget, str], object]

#: Set while planning searches for the least memory a plan runs at: refusals inside are not
#: searched again.
_SEARCHING_MINIMUM: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "memchunk_searching_minimum", default=False
)
#: Plans tried upward from a refusal's minimum before the search gives up (each refusal there
#: states a larger one: a baseline raised by the operator's calibration, then its task).
MINIMUM_SEARCH_STEPS = 4


def least_memory_that_plans(
    at_least: Budget, stated: int | None, replan: Replan, measure: str
) -> int | None:
    """The least worker memory from ``at_least``'s up at which the operator's plan runs.

    The plan is made there by ``replan``, its warnings kept quiet, first with nothing
    measured, then as asked (``measure``: what producing a graph's input holds counts; a
    function with no model yet is measured, and what its runs leave in a worker raises the
    baseline: a new user's anomaly function, refused with the room for a task at 248.42 MiB,
    was refused there again with 285.23 MiB once measured), then with nothing measured again
    (what was measured as asked, a larger calibration, may state a larger baseline). Where it
    is refused with a larger minimum (the operator's task; a baseline raised by what
    calibrating it left in its worker), that one is tried, up to
    :data:`MINIMUM_SEARCH_STEPS` times. None where the search ends without a plan (a refusal
    that states no larger minimum, a function never measured, or another error), where the
    plan runs at the refusal's ``stated`` minimum, and where planning is searching already (a
    refusal inside the search is not searched again).
    """
    if _SEARCHING_MINIMUM.get():
        return None
    token = _SEARCHING_MINIMUM.set(True)
    needed: int | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(MINIMUM_SEARCH_STEPS):
                minimums: list[int | None] = []  # each refusal's
                # nothing measured, as asked, then nothing measured again: a calibration made
                # as asked (the operator measured on larger blocks) may raise the baseline
                planned = False
                for each in ("never", measure, "never")[: 1 if measure == "never" else 3]:
                    try:
                        replan(at_least, each)
                    except InfeasiblePlanError as refused:
                        minimums.append(refused.minimum_memory_limit)
                    except CalibrationError:  # a function with no model yet: as asked
                        if each != "never":  # measures it, where it may
                            return None
                    except MemchunkError:  # another refusal
                        return None
                    else:
                        planned = True
                if not minimums:
                    if not planned:  # never measured (measure="never"): nothing to say
                        return None
                    needed = at_least.worker_memory
                    break
                if None in minimums or max(minimums) <= at_least.worker_memory:
                    return None
                try:
                    at_least = budget_with_memory(at_least, max(minimums))
                except BudgetError:
                    return None
    finally:
        _SEARCHING_MINIMUM.reset(token)
    return None if needed == stated else needed


#: A refusal that states the least memory it runs at (:func:`minimum_first`).
_Refusal = TypeVar("_Refusal", BudgetError, InfeasiblePlanError)


def _with_operators_minimum(
    no_room: BudgetError, operator: Operator, replan: Replan, measure: str
) -> BudgetError:
    """``no_room``, or the same refusal with what the operator needs beyond a task's room.

    The least memory the plan runs at is searched from the least with room for a task
    (``no_room.budget_at_minimum``: :func:`least_memory_that_plans`). Where the plan runs
    there, or the search finds nothing, ``no_room`` stands as it is.
    """
    at_least = no_room.budget_at_minimum
    if not isinstance(at_least, Budget):
        return no_room
    stated = no_room.minimum_memory_limit
    needed = least_memory_that_plans(at_least, stated, replan, measure)
    if needed is None:
        return no_room
    advice = at_least.memory_limit_advice(needed)
    return BudgetError(
        f"{no_room.reason}. {advice[0].upper()}{advice[1:]}: {operator.name!r} needs more "
        f"than the least memory with room for a task (plan with that memory_limit to see its "
        f"chunks)",
        minimum_memory_limit=needed,
        reason=no_room.reason,
    )


def _no_room_refusal(error: BudgetError) -> BudgetError:
    """``error`` as a :class:`~xarray_memchunk.NoRoomForTaskError` where it states a minimum.

    Also an ``InfeasiblePlanError``: a new user's script caught a plan refused on workers of
    its own process as ``BudgetError`` only, and crashed. Planning itself tells the two apart.
    """
    if error.minimum_memory_limit is None or isinstance(error, NoRoomForTaskError):
        return error
    refusal = NoRoomForTaskError(
        str(error), minimum_memory_limit=error.minimum_memory_limit, reason=error.reason
    )
    refusal.budget_at_minimum = error.budget_at_minimum
    return refusal


def refusal_for_no_room(
    no_room: BudgetError, operator: Operator, replan: Replan, measure: str
) -> BudgetError:
    """``no_room`` as :func:`~xarray_memchunk.api.plan` raises it, where a task has no room.

    Led by the least memory the operator's plan runs at (searched from the room for a task),
    and a :class:`~xarray_memchunk.NoRoomForTaskError`.
    """
    needs = _with_operators_minimum(no_room, operator, replan, measure)
    return _no_room_refusal(minimum_first(needs, no_room.budget_at_minimum, operator))


def minimum_first(refused: _Refusal, budget: Budget | None, operator: Operator) -> _Refusal:
    """``refused`` led by the least memory it states, where it states one.

    A refusal may give several figures on its way (in memory, staged, the room for a task,
    then what planning there needs): a new user's read the first, 515.85 MiB for a GST3D that
    ran from 438.65 MiB staged. The lead is :attr:`minimum_memory_limit`, the one that runs.
    """
    needed = refused.minimum_memory_limit
    if needed is None or not isinstance(budget, Budget):
        return refused
    growth = _growth_allowance(budget)
    why = str(refused)
    if growth:  # the figures it gives on its way are the lead's, its allowance included
        why = why.replace(budget.format_minimum(needed), budget.format_minimum(needed + growth))
        needed += growth
    advice = budget.memory_limit_advice(needed)
    said = _without_superseded_room(why, budget.format_minimum(needed))
    figures = set(re.findall(r"at least (\S+ \S+) \(memory_limit\)", said))
    if not growth and said == why and figures <= {budget.format_minimum(needed)}:  # said once
        return refused
    why = said
    if growth:
        moves = (
            "this process may grow by up to {} while it plans again"
            if budget.baseline_is_this_process
            else "a new cluster's workers may hold up to {} more when the plan is made"
        )
        advice += (
            f" ({format_size(growth)} of it a margin: "
            f"{moves.format(format_size(memory_limits.PLANNING_GROWTH_BYTES))})"
        )
    # a trial's user met 904.31 MiB, then 0.97 GiB further on, and could not tell which to use
    others = figures - {budget.format_minimum(needed)}  # those of ``said``, which ``why`` is
    ways = "; each way below states what it alone needs" if others else ""
    message = f"{operator.name!r} needs more memory: {advice}{ways}. Why: {why}"
    if isinstance(refused, BudgetError):
        led = BudgetError(message, minimum_memory_limit=needed, reason=refused.reason)
        led.budget_at_minimum = refused.budget_at_minimum
        return led
    return InfeasiblePlanError(message, minimum_memory_limit=needed)


#: The advice of a refusal for no room for a task (``planning.budget.per_task_bytes``); its
#: figure is the first group.
_ROOM_ADVICE = re.compile(
    r"\. Give (?:it|each worker) at least (\S+ \S+) \(memory_limit\); twice that leaves a task "
    r"about \S+ \S+ per thread"
)


def _without_superseded_room(why: str, lead: str) -> str:
    """``why`` without the advice of room for a task where planning there found ``lead`` more.

    A new user's refusal said "give each worker at least 395.68 MiB", then in its reasons "Give
    each worker at least 366.73 MiB (memory_limit); twice that leaves a task about 132.02 MiB
    per thread ... Planned at that memory_limit, ... needs more: ... 395.68 MiB": two minimums
    in one message. The first is dropped, and what follows it says where it was planned.
    """
    said = _ROOM_ADVICE.sub(lambda m: m.group(0) if m.group(1) == lead else "", why)
    if said == why:
        return why
    return said.replace("Planned at that memory_limit,", "Planned with room for a task,")


def _growth_allowance(budget: Budget) -> int:
    """What a refusal's stated minimum adds for a baseline that moves between plans, in bytes.

    With no cluster, the baseline is this process's memory when it plans, which planning
    itself raises a little (files opened and measured): a trial's median over
    ``open_mfdataset`` files, planned at the minimum its refusal stated, was refused for
    0.22 MiB more. On a cluster, it is the largest worker's memory where that is above the
    configured baseline, read when the plan is made: a trial's function, refused at 350 MB
    with "at least 384.63 MiB", was refused on a new cluster of that limit with "at least
    385.43 MiB" (a second trial: 386.02, then 387.01 MiB). The stated minimum allows
    :data:`~xarray_memchunk.memory_limits.PLANNING_GROWTH_BYTES` of that (above the pause
    threshold's share), where the baseline is this process's memory or was read from a
    cluster's workers (not a budget made by hand, or the threaded scheduler's configured
    one); none inside the search for a minimum, which states no figure.
    """
    moves = budget.baseline_is_this_process or budget.read_from_cluster
    if not moves or not budget.from_formula or _SEARCHING_MINIMUM.get():
        return 0
    return math.ceil(memory_limits.PLANNING_GROWTH_BYTES / budget.pause_fraction)


def checked_minimum(
    refused: InfeasiblePlanError,
    resolved: Budget,
    operator: Operator,
    replan: Replan,
    measure: str,
) -> InfeasiblePlanError:
    """``refused``, with the least memory its plan runs at where the minimum it states is not.

    A refusal's minimum can be only room for a task: where what calibrating the operator left
    in its worker raises the baseline past the pause threshold (a new user's rolling mean,
    refused at 238.42 MiB, said "at least 238.49 MiB", and was refused there again, stating
    none). The stated minimum is planned (:func:`least_memory_that_plans`); where more is
    needed, the refusal says so and states it.
    """
    stated = refused.minimum_memory_limit
    if stated is None or not resolved.from_formula:
        return refused
    try:
        at_least = budget_with_memory(resolved, stated)
    except BudgetError:
        return refused
    needed = least_memory_that_plans(at_least, stated, replan, measure)
    if needed is None:
        return refused
    advice = resolved.memory_limit_advice(needed)
    return InfeasiblePlanError(
        f"{refused}. Planned at that memory_limit, {operator.name!r} needs more: {advice}",
        minimum_memory_limit=needed,
    )

"""Checks of operator arguments, shared by every operator: clear errors before anything runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import MemchunkError

__all__ = ["check_number", "float_dtype", "reject_unknown"]


def reject_unknown(
    operator: str, unknown: Iterable[str], accepted: Iterable[str] | Callable[..., Any]
) -> None:
    """Raise naming the ``unknown`` arguments and the ``accepted`` ones.

    ``accepted`` may be a function: its named parameters are the accepted arguments.
    """
    unknown = sorted(unknown)
    if not unknown:
        return
    if callable(accepted):
        parameters = inspect.signature(accepted).parameters.values()
        accepted = [p.name for p in parameters if p.kind is not p.VAR_KEYWORD]
    raise MemchunkError(
        f"{operator} got unexpected arguments {unknown}; it takes {', '.join(accepted)}"
    )


def check_number(
    operator: str,
    label: str,
    value: Any,
    *,
    integer: bool = False,
    minimum: float | None = 0.0,
) -> float | int:
    """``value`` as a finite number (an int when ``integer``) of at least ``minimum``.

    Raises
    ------
    MemchunkError
        Naming the argument and what it got, whatever the wrong type or value.
    """
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not np.isfinite(value):
        kind = "an int" if integer else "a number"
        raise MemchunkError(f"{operator} {label} must be {kind}, got {value!r}")
    if minimum is not None and value < minimum:
        raise MemchunkError(f"{operator} {label} must be at least {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def float_dtype(value: Any, what: str) -> np.dtype:
    """``value`` as a float dtype, or a :class:`MemchunkError` naming ``what`` was wrong."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "f":
        raise MemchunkError(f"{what} must be a float dtype such as float32, got {value!r}")
    return dtype

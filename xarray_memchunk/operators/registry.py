"""The operator registry: names to :class:`Operator` objects."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import MemchunkError, UnknownOperatorError
from .base import Operator

__all__ = ["get_operator", "operator_names", "register_builtins", "register_operator"]

_REGISTRY: dict[str, Operator] = {}
#: Names of the operators xarray-memchunk ships, which no user operator may replace.
_BUILTIN: set[str] = set()


def register_operator(operator: Operator, *, overwrite: bool = False) -> Operator:
    """Register ``operator`` under ``operator.name`` so that ``.memchunk.plan(name)`` finds it.

    Parameters
    ----------
    operator
        An :class:`Operator` instance with a non-empty ``name``.
    overwrite
        Replace a user operator already registered under that name (a built-in one is never
        replaced).

    Returns
    -------
    Operator
        ``operator``, so that this can be used as a one-liner.

    Raises
    ------
    MemchunkError
        When the name is taken: by a built-in operator, or by another operator without
        ``overwrite``.
    """
    if not isinstance(operator, Operator):
        raise MemchunkError(
            f"register_operator takes an Operator instance, got {type(operator).__name__}"
        )
    if not operator.name:
        raise MemchunkError("an operator needs a non-empty .name to be registered")
    if operator.name in _BUILTIN and _REGISTRY[operator.name] is not operator:
        raise MemchunkError(
            f"{operator.name!r} is the name of a built-in operator, which would no longer be "
            f"found; give yours another name (e.g. 'my-{operator.name}')"
        )
    if operator.name in _REGISTRY and not overwrite:
        raise MemchunkError(
            f"an operator named {operator.name!r} is already registered; pass overwrite=True "
            f"to replace it"
        )
    _REGISTRY[operator.name] = operator
    return operator


def register_builtins(operators: Iterable[Operator]) -> None:
    """Register the operators xarray-memchunk ships; user operators cannot take their names."""
    for operator in operators:
        register_operator(operator)
        _BUILTIN.add(operator.name)


def get_operator(op: str | Operator) -> Operator:
    """Return the operator ``op`` names (or ``op`` itself when it is an :class:`Operator`).

    Raises
    ------
    UnknownOperatorError
        When no operator of that name is registered; the message lists the known names.
    """
    if isinstance(op, Operator):
        return op
    if isinstance(op, str) and op in _REGISTRY:
        return _REGISTRY[op]
    raise UnknownOperatorError(
        f"unknown operator {op!r}; known operators: {', '.join(operator_names())}. "
        f"Register your own with xarray_memchunk.register_operator()."
    )


def operator_names() -> list[str]:
    """Names of the registered operators, sorted."""
    return sorted(_REGISTRY)

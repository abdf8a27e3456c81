"""The operator registry: names to :class:`Operator` objects.

Built-in operators are found, not listed: every module (or package) directly under
``xarray_memchunk/operators/`` that assigns ``BUILTINS = (...)`` at its top level is imported
when the package is, and the operators in its ``BUILTINS`` are registered as built-in
(:func:`load_builtins`). Adding a built-in operator is adding such a module (and its
calibration files); nothing else lists it.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Iterable

from ..errors import MemchunkError, UnknownOperatorError
from .base import Operator

__all__ = [
    "builtin_operators",
    "get_operator",
    "load_builtins",
    "operator_names",
    "register_builtins",
    "register_operator",
]

_REGISTRY: dict[str, Operator] = {}
#: Names of the operators xarray-memchunk ships, which no user operator may replace.
_BUILTIN: set[str] = set()
#: A top-level ``BUILTINS = ...`` (or ``BUILTINS: ... = ...``) assignment in a module's source.
_DECLARES_BUILTINS = re.compile(r"^BUILTINS\b\s*(:[^=\n]*)?=", re.MULTILINE)


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


def _declares_builtins(module_name: str) -> bool:
    """Whether the source of ``module_name`` assigns ``BUILTINS`` at its top level.

    Read without importing the module; a module whose source cannot be read (an install
    without ``.py`` files) is imported to find out.
    """
    spec = importlib.util.find_spec(module_name)
    source = None
    if spec is not None and spec.loader is not None and hasattr(spec.loader, "get_source"):
        source = spec.loader.get_source(module_name)
    if source is None:
        return hasattr(importlib.import_module(module_name), "BUILTINS")
    return _DECLARES_BUILTINS.search(source) is not None


def load_builtins(package: str, path: Iterable[str]) -> list[str]:
    """Import the modules of ``package`` that declare ``BUILTINS`` and register those operators.

    Parameters
    ----------
    package
        The package's name, ``"xarray_memchunk.operators"``.
    path
        Its ``__path__``: the modules and packages directly in it are scanned, in
        alphabetical order (:func:`pkgutil.iter_modules`); a package declares its
        ``BUILTINS`` in its ``__init__``.

    Returns
    -------
    list of str
        The modules imported for their ``BUILTINS``, in the order they were registered.

    Raises
    ------
    MemchunkError
        When a module's ``BUILTINS`` holds something other than operators, or two built-in
        operators share a name.
    """
    loaded = []
    for info in pkgutil.iter_modules(list(path), prefix=f"{package}."):
        if not _declares_builtins(info.name):
            continue
        module = importlib.import_module(info.name)
        operators = tuple(getattr(module, "BUILTINS", ()))
        if not all(isinstance(op, Operator) for op in operators):
            raise MemchunkError(f"{info.name}.BUILTINS must hold Operator instances only")
        register_builtins(operators)
        loaded.append(info.name)
    return loaded


def builtin_operators() -> list[Operator]:
    """The operators xarray-memchunk ships, in the order they were registered."""
    return [op for name, op in _REGISTRY.items() if name in _BUILTIN]


def is_builtin(op: Operator) -> bool:
    """Whether ``op`` is one of the operators xarray-memchunk ships (not a user's)."""
    return op.name in _BUILTIN and _REGISTRY.get(op.name) is op


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
    if callable(op):
        name = getattr(op, "__name__", repr(op))
        raise UnknownOperatorError(
            f"{name!r} is a plain function, not an operator: a plan needs to know which dims "
            f"it needs whole and how far it reads past a block (its halo). Decorate it, "
            f"@xarray_memchunk.operator(depth={{...}}, whole=[...]) (neither for a function "
            f"of each element alone), and pass the decorated function; its first plan measures "
            f"its memory"
        )
    raise UnknownOperatorError(
        f"unknown operator {op!r}; known operators: {', '.join(operator_names())}. "
        f"Register your own with xarray_memchunk.register_operator()."
    )


def operator_names() -> list[str]:
    """Names of the registered operators, sorted."""
    return sorted(_REGISTRY)

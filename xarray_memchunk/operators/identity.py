"""The identity of a user's function: the name its self-calibration is saved under.

Two functions share a calibration only when they compute the same thing: the same code at the
same place (two lambdas on one line differ), the same values closed over, the same default
arguments, the same bound object (``Filt(4).run`` is not ``Filt(5).run``), the same
``functools.partial`` arguments and the same global values and helper functions of the user's
module. Values are hashed by content (:func:`joblib.hash`: NumPy arrays by their bytes), so the
same function defined again, in this process or in the next one, has the same identity and its
calibration is found again. Where a value cannot be hashed stably (it cannot be pickled, or two
hashes of it differ), the identity is unknown and says why.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import inspect
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
import joblib
import numpy as np

__all__ = ["Identity", "arguments_identity", "calibration_key", "identify", "module_of"]

#: Values whose ``repr`` is their content, the same in every process.
_LITERALS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))


@dataclass(frozen=True)
class Identity:
    """A content digest, and why it may not identify its value.

    Attributes
    ----------
    digest
        Hexadecimal SHA-256 of the value's content.
    reason
        Empty when the digest identifies the value; otherwise what could not be hashed stably.
    """

    digest: str
    reason: str = ""

    @property
    def known(self) -> bool:
        """Whether the digest identifies the value (equal digests, the same computation)."""
        return not self.reason


def identify(*values: Any, home: str | None = None) -> Identity:
    """The :class:`Identity` of ``values``: functions by code and state, data by content.

    Functions (plain, bound, ``functools.partial``, callable objects) of the user's module
    (``home``, the first value's module by default, and ``__main__``) are followed into their
    code, closure cells, defaults, bound object and the globals they read; functions of other
    modules (NumPy, SciPy, ...) are identified by their qualified name.
    """
    if home is None and values and callable(values[0]):
        home = module_of(values[0])
    hasher = _Hasher({"__main__", home or "__main__"})
    try:
        digest = _join("values", *(hasher.value(v) for v in values))
    except RecursionError:
        return Identity(_join("too deep"), "a value is nested too deeply to be hashed")
    return Identity(digest, "; ".join(dict.fromkeys(hasher.unknown)))


def _join(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def module_of(func: Any) -> str:
    """The module ``func`` was defined in (a partial's or a bound method's function's)."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)
    return getattr(target, "__module__", None) or getattr(type(target), "__module__", "")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


class _Hasher:
    """Digests of values; collects why some of them could not be hashed stably."""

    def __init__(self, home: set[str]) -> None:
        self.home = home  # modules whose functions are followed into their code
        self.unknown: list[str] = []
        self._active: set[int] = set()  # functions being hashed (recursion guard)

    def value(self, obj: Any) -> str:
        """Digest of any value, functions and containers included."""
        if isinstance(obj, _LITERALS):
            return f"{type(obj).__name__}:{obj!r}"
        if isinstance(obj, types.ModuleType):
            return f"module:{obj.__name__}"
        if isinstance(obj, functools.partial):
            parts = (self.value(obj.func), self.value(obj.args), self.value(obj.keywords))
            return _join("partial", *parts)
        if isinstance(obj, types.MethodType):
            return _join("method", self.value(obj.__func__), self.value(obj.__self__))
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, tuple | list):
            return _join(type(obj).__name__, *map(self.value, obj))
        if isinstance(obj, set | frozenset):
            return _join(type(obj).__name__, *sorted(map(self.value, obj)))
        if isinstance(obj, dict):
            items = sorted(_join(self.value(k), self.value(v)) for k, v in obj.items())
            return _join("dict", *items)
        if isinstance(obj, np.ndarray):
            return joblib.hash(obj)
        call = inspect.getattr_static(type(obj), "__call__", None)
        if isinstance(call, types.FunctionType) and module_of(obj) in self.home:
            return _join("callable", self._function(call), self._content(obj))
        return self._content(obj)

    def _function(self, func: types.FunctionType) -> str:
        """Digest of a function of the user's module by content, of another one by name."""
        name = f"{func.__module__}.{func.__qualname__}"
        if func.__module__ not in self.home:
            return f"function:{name}"
        if id(func) in self._active:
            return f"recursive:{name}"
        self._active.add(id(func))
        try:
            return _join(
                "function",
                name,
                self._code(func.__code__),
                self.value(func.__defaults__),
                self.value(func.__kwdefaults__),
                *(self._cell(cell) for cell in func.__closure__ or ()),
                *(self._global(func, g) for g in sorted(set(_global_names(func.__code__)))),
            )
        finally:
            self._active.discard(id(func))

    def _code(self, code: types.CodeType) -> str:
        """Digest of compiled code: instructions, constants, names and how it is laid out.

        Its lines are counted from its first, not from the file's: a line added above the
        function (a comment, an import) leaves its identity, and what runs taught about it.
        """
        consts = [
            self._code(c) if isinstance(c, types.CodeType) else self.value(c)
            for c in code.co_consts
        ]
        counts = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount)
        return _join(
            "code",
            code.co_code.hex(),
            repr((counts, code.co_flags, code.co_names)),
            repr(_positions(code)),
            *consts,
        )

    def _cell(self, cell: types.CellType) -> str:
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not yet filled
            return "empty cell"
        return self.value(contents)

    def _global(self, func: types.FunctionType, name: str) -> str:
        """Digest of a global ``func`` reads: its value, or a built-in's name."""
        if name not in func.__globals__:
            return f"builtin:{name}"
        return _join("global", name, self.value(func.__globals__[name]))

    def _content(self, obj: Any) -> str:
        """Digest of a value by its pickled content, hashed twice to check that it is stable."""
        for dump in (joblib.hash, _cloudpickle_hash):
            try:
                first, second = dump(obj), dump(obj)
            except Exception:  # any failure to pickle: try the next way
                continue
            if first != second:
                self.unknown.append(f"{_describe(obj)} hashes differently each time")
            return first
        self.unknown.append(f"{_describe(obj)} cannot be pickled")
        return f"unhashable:{type(obj).__qualname__}"


def _cloudpickle_hash(obj: Any) -> str:
    return hashlib.sha256(cloudpickle.dumps(obj)).hexdigest()


def _positions(code: types.CodeType) -> tuple:
    """Lines (from the first) and columns of the code's instructions: two lambdas on a line."""
    first = code.co_firstlineno
    return tuple(
        sorted(
            {
                (line - first, end - first, column, end_column)
                for line, end, column, end_column in code.co_positions()
                if None not in (line, end, column, end_column)
            }
        )
    )


def _global_names(code: types.CodeType) -> Iterator[str]:
    """Names of the globals ``code`` (and the code nested in it) reads."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in {"LOAD_GLOBAL", "LOAD_NAME"}:
            yield str(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def arguments_identity(func: Any, kwargs: Mapping[str, Any]) -> Identity:
    """Identity of the keyword arguments ``func`` is called with, as a calibration key uses it.

    Empty for no arguments. Where they cannot be hashed stably, the digest is of the objects
    themselves (their ``id``): other objects are calibrated apart, and the reason says why.
    """
    import dask.base

    arguments = dict(kwargs)
    if not arguments:
        return Identity("")
    identity = identify(arguments, home=module_of(func))
    if identity.known:
        return identity
    objects = sorted((k, id(v)) for k, v in arguments.items())
    return Identity(dask.base.tokenize(objects), identity.reason)


def calibration_key(
    name: str, func: Any, kwargs: Mapping[str, Any], function_doubt: str = ""
) -> tuple[str, str]:
    """A user function's calibration key for these arguments, and why it may not identify it.

    ``name`` is the operator's key for the function (its name and the function's identity);
    the arguments' digest is appended where there are arguments. The doubt joins the
    function's (``function_doubt``) and the arguments' reasons; empty where there is none.
    """
    arguments = arguments_identity(func, kwargs)
    key = f"{name}-{arguments.digest[:8]}" if arguments.digest else name
    return key, "; ".join(r for r in (function_doubt, arguments.reason) if r)

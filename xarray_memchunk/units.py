"""Byte sizes written and read the way Dask writes and reads them.

Reading (:func:`to_bytes`) is Dask's :func:`~dask.utils.parse_bytes`: ``"1.5GB"`` is 1.5e9
bytes and ``"1.5GiB"`` is 1.5 x 2**30, as ``LocalCluster(memory_limit=...)`` reads them.

Writing: every size a user reads (plans, their notes, budgets, warnings and errors) is in
binary units (kiB, MiB, GiB, TiB: powers of 1024), because Dask and distributed print the same
quantities so (:func:`dask.utils.format_bytes`: an array's repr, the dashboard, a worker's
memory warnings), and a size here is then compared with theirs at a glance. A memory limit
written in decimal units (``"2GB"``) is shown converted, once: ``memory_limit 2 GB = 1.86 GiB``
(:func:`format_decimal`).
"""

from __future__ import annotations

import math

from dask.utils import format_bytes, parse_bytes

from .errors import BudgetError

__all__ = [
    "format_bytes",
    "format_decimal",
    "format_in_unit_of",
    "format_size",
    "format_seconds",
    "format_size_up",
    "to_bytes",
]

#: The binary units sizes are written in, largest first, as :func:`dask.utils.format_bytes`.
BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("kiB", 2**10))


def _unit(nbytes: float) -> tuple[str, int]:
    """The unit :func:`format_size` writes ``nbytes`` in (a unit from 0.9 of it up)."""
    for unit, scale in BINARY_UNITS:
        if abs(nbytes) >= 0.9 * scale:
            return unit, scale
    return "B", 1


def format_size(nbytes: float) -> str:
    """``1.40 GiB``: a size as Dask prints it (:func:`dask.utils.format_bytes`)."""
    return format_bytes(int(nbytes))


def format_size_up(nbytes: float) -> str:
    """As :func:`format_size`, rounded up to the hundredth of the unit shown.

    ``1.40 GiB`` is printed for 1.399 GiB and for 1.401 GiB alike; a stated minimum must not be
    the smaller one: 1.401 GiB is said ``1.41 GiB``.
    """
    unit, scale = _unit(nbytes)
    if scale == 1:
        return f"{math.ceil(nbytes)} B"
    return f"{math.ceil(nbytes / scale * 100 - 1e-9) / 100:.2f} {unit}"


def format_in_unit_of(nbytes: float, reference: float) -> str:
    """``nbytes`` in the unit :func:`format_size` writes ``reference`` in: ``1,907.35 MiB``.

    The terms of a sum or a formula written in one unit can be checked by hand.
    """
    unit, scale = _unit(reference)
    if scale == 1:
        return f"{nbytes:,.0f} B"
    return f"{nbytes / scale:,.2f} {unit}"


def format_decimal(nbytes: float) -> str:
    """``2 GB``, ``1.5 GB``, ``700 MB``: a size in the decimal units a user may have written."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.6g} {unit}"
    return f"{int(nbytes)} B"


def format_seconds(seconds: float) -> str:
    """Seconds as a plan's notes write them: ``0.25 s``, ``3.4 s``, ``42 s``.

    Two significant figures below 10 s, whole seconds above: estimates compared in one note
    (re-reads against staging) stay apart where both are under a second.
    """
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def to_bytes(value: int | float | str, *, what: str = "budget") -> int:
    """Convert a size such as ``1.5e9``, ``"1.5GB"`` or ``"1.5GiB"`` to a positive int of bytes.

    Parameters
    ----------
    value
        An int or float of bytes, or a string parsed by :func:`dask.utils.parse_bytes`
        (``"1.5GB"`` is 1.5e9 bytes, ``"1.5GiB"`` is 1.5 * 2**30).
    what
        Name of the quantity, used in the error message.

    Raises
    ------
    BudgetError
        When the value cannot be parsed, is not finite (NaN, infinity, ``"1e400"``), or is
        zero or negative.
    """
    if isinstance(value, bool):
        raise BudgetError(
            f"{what} must be a size such as '1.5GB' or a number of bytes, not {value!r}"
        )
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise BudgetError(f"{what} must be a finite size, got {value!r}")
        nbytes = int(value)
    elif isinstance(value, str):
        if not value.strip() or not any(ch.isdigit() for ch in value):
            raise BudgetError(
                f"cannot parse {what} {value!r}: write a size as Dask does, e.g. '1.5GB', "
                f"'1536MiB' or a number of bytes"
            )
        try:
            parsed = parse_bytes(value)
            if not math.isfinite(parsed):
                raise ValueError("not a finite size")
            nbytes = int(parsed)
        except (ValueError, TypeError, OverflowError) as exc:
            raise BudgetError(
                f"cannot parse {what} {value!r}: write a size as Dask does, e.g. '1.5GB', "
                f"'1536MiB' or a number of bytes"
            ) from exc
    else:
        raise BudgetError(
            f"{what} must be a size such as '1.5GB' or a number of bytes, "
            f"not {type(value).__name__}"
        )
    if nbytes <= 0:
        raise BudgetError(f"{what} must be positive, got {value!r}")
    return nbytes

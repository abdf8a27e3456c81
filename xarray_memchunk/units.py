"""Byte sizes written and read the way Dask writes and reads them."""

from __future__ import annotations

import math

from dask.utils import format_bytes, parse_bytes

from .errors import BudgetError

__all__ = ["format_bytes", "to_bytes"]


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

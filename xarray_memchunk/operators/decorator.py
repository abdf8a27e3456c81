"""``@xarray_memchunk.operator``: a function made an operator (NumPy block function or xarray)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import Halo
from .base import Operator
from .blockwise import BlockwiseOperator, function_name
from .xarray_function import XarrayFunctionOperator, takes_xarray

__all__ = ["operator"]


def operator(
    name: str | None = None,
    *,
    depth: Mapping[str, Halo] | None = None,
    whole: Sequence[str] = (),
    free: Sequence[str] | None = None,
    dtype: np.dtype | str | None = None,
    drop_dims: Sequence[str] = (),
    new_dims: Mapping[str, int] | None = None,
    memory_model: LinearMemoryModel | None = None,
    description: str = "",
    xarray: bool | None = None,
    register: bool = True,
) -> Callable[[Callable[..., Any]], Operator]:
    """Decorate a function to make it a (self-calibrating) operator.

    A NumPy block function becomes a :class:`BlockwiseOperator` (its arguments). A function of
    an xarray object (``xarray=True``, or its first parameter annotated ``xr.DataArray``, or
    ``free=`` given) becomes an
    :class:`~xarray_memchunk.operators.xarray_function.XarrayFunctionOperator`, which takes
    ``whole`` or ``free`` only. The name defaults to the function's (a ``functools.partial``'s
    function's). The operator is registered (replacing a user operator of the same name, so a
    notebook cell can be run again; never a built-in one) unless ``register=False``.

    Examples
    --------
    >>> @operator(depth={"inline": 2, "crossline": 2, "sample": 2})
    ... def smoothed(block):
    ...     return scipy.ndimage.uniform_filter(block, 5)
    >>> dip = volume.memchunk.apply(smoothed)      # doctest: +SKIP

    >>> @operator(whole=["time"])
    ... def climatology(tas: xr.DataArray) -> xr.DataArray:
    ...     return tas.groupby("time.month").mean()
    >>> clim = ds.memchunk.apply(climatology)      # doctest: +SKIP
    """

    def wrap(func: Callable[..., Any]) -> Operator:
        from .registry import register_operator

        named = name or _decorated_name(func)
        on_xarray = xarray if xarray is not None else (free is not None or takes_xarray(func))
        op: Operator
        if on_xarray:
            numpy_only = {
                "depth": depth,
                "dtype": dtype,
                "drop_dims": tuple(drop_dims),
                "new_dims": new_dims,
            }
            given = [k for k, v in numpy_only.items() if v]
            if given:
                raise MemchunkError(
                    f"operator {named!r} takes an xarray object: {', '.join(given)} apply to "
                    f"NumPy block functions only (xarray keeps the dims and dtype the function "
                    f"returns); give whole=... or free=..."
                )
            op = XarrayFunctionOperator(
                named,
                func,
                whole=whole,
                free=free,
                memory_model=memory_model,
                description=description,
            )
        else:
            if free is not None:
                raise MemchunkError(
                    f"operator {named!r}: free=... is for functions of xarray objects; "
                    f"declare it with xarray=True, or give a NumPy function whole=..."
                )
            op = BlockwiseOperator(
                named,
                func,
                memory_model=memory_model,
                depth=depth,
                whole=whole,
                dtype=dtype,
                drop_dims=drop_dims,
                new_dims=new_dims,
                description=description,
            )
        if register:
            register_operator(op, overwrite=True)
        return op

    return wrap


def _decorated_name(func: Callable[..., Any]) -> str:
    """The name :func:`operator` gives ``func``'s operator: the function's name."""
    name = function_name(func)
    if name is None:
        raise MemchunkError(
            f"@xarray_memchunk.operator cannot name an operator after {func!r}, which has no "
            f"function name: give one with @xarray_memchunk.operator(name=...)"
        )
    return name

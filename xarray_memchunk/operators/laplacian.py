"""Laplacian: the 5-point discrete Laplacian over two dims, one task per chunk with a halo of 1.

``out[i, j] = x[i-1, j] + x[i+1, j] + x[i, j-1] + x[i, j+1] - 4 x[i, j]`` over the two dims
(the last two by default, or ``dims=``: names or CF axes such as ``("Y", "X")``); any other dim
is free. Beyond the array's edges the nearest value is repeated: the result equals
``scipy.ndimage.laplace(x, mode="nearest")`` on each 2-D slice (to rounding: SciPy sums the
terms in another order). It has the input's dtype, shape, dims and coordinates, and no
attributes (the input's units are not the Laplacian's).

Each task computes on its block padded by one element per interior side
(:func:`~xarray_memchunk.operators.sources.map_blocks_with_halo`: read from the file, halo
included, for file data), by slicing the padded block: no ``np.roll``, no padded copy. A
chunked result equals the unchunked one element for element: every element sums the same
terms in the same order whatever the chunking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import DimensionError, MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .arguments import reject_unknown
from .base import Cost, DimUse, Operator, input_output_features
from .dims import resolve_dim
from .sources import map_blocks_with_halo

__all__ = ["Laplacian", "laplacian_dims", "laplacian_on_axes"]

#: Elements each task reads beyond its chunk on each interior side, along both dims.
HALO = 1


def laplacian_dims(da: xr.DataArray, dims: Sequence[str] | None = None) -> tuple[str, str]:
    """The two dims of ``da`` the Laplacian is taken over.

    Parameters
    ----------
    da
        The variable.
    dims
        Two dim names or CF axes / standard names (``("Y", "X")``); the last two dims of
        ``da`` when None.

    Returns
    -------
    tuple of str
        The two dims, in the order given.

    Raises
    ------
    DimensionError
        When ``da`` has fewer than two dims, or ``dims`` names a missing dim or one dim twice.
    """
    if dims is None:
        if da.ndim < 2:
            raise DimensionError(
                f"laplacian needs two dims, got a variable with dims {tuple(da.dims)}"
            )
        found = (str(da.dims[-2]), str(da.dims[-1]))
    else:
        found = (resolve_dim(da, dims[0]), resolve_dim(da, dims[1]))
    if found[0] == found[1]:
        raise DimensionError(f"laplacian needs two different dims, got {found}")
    return found


def _arguments(dims: Sequence[str] | None = None, **unknown: Any) -> dict[str, Any]:
    """The Laplacian's arguments checked, with their defaults.

    Raises
    ------
    MemchunkError
        On an unknown argument, or ``dims`` that are not two names.
    """
    reject_unknown(Laplacian.name, unknown, _arguments)
    if dims is not None and (isinstance(dims, str) or len(dims) != 2):
        raise MemchunkError(f"laplacian dims must name two dims, e.g. ('y', 'x'), got {dims!r}")
    return {"dims": tuple(dims) if dims is not None else None}


def _along(ndim: int, axis: int, start: int | None, stop: int | None) -> tuple[slice, ...]:
    """The index of ``[start:stop]`` along ``axis`` of an ``ndim``-d array, all of the others."""
    index = [slice(None)] * ndim
    index[axis] = slice(start, stop)
    return tuple(index)


def laplacian_on_axes(block: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """The 5-point Laplacian of ``block`` over ``axes``, the nearest value repeated at its edges.

    Parameters
    ----------
    block
        A float array (a task's block, padded by its halo on interior sides).
    axes
        The two axes.

    Returns
    -------
    numpy.ndarray
        The Laplacian, of ``block``'s shape and dtype. Holds ``block`` and the result only:
        the neighbours are added in place, through slices of ``block``.
    """
    out = block * block.dtype.type(-4)
    n = block.ndim
    for axis in axes:
        out[_along(n, axis, 1, None)] += block[_along(n, axis, None, -1)]  # the one before
        out[_along(n, axis, None, 1)] += block[_along(n, axis, None, 1)]  # the first: itself
        out[_along(n, axis, None, -1)] += block[_along(n, axis, 1, None)]  # the one after
        out[_along(n, axis, -1, None)] += block[_along(n, axis, -1, None)]  # the last: itself
    return out


class Laplacian(Operator):
    """The 5-point Laplacian over two dims, the nearest value repeated beyond the edges.

    Keyword Arguments:
    -----------------
    dims : sequence of 2 str, optional
        The two dims (names or CF axes); the last two dims of each variable by default.
    """

    name = "laplacian"
    description = "5-point Laplacian over two dims (the last two, or dims=), halo 1"
    dtype_kinds = "f"

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs: ``dims`` only.

        Raises
        ------
        MemchunkError
            On an unknown argument, or ``dims`` that are not two names.
        """
        return _arguments(**kwargs) if da is None else dict(kwargs)

    def dims(
        self, da: xr.DataArray, dims: Sequence[str] | None = None, **kwargs: Any
    ) -> dict[str, DimUse]:
        """The two dims are halo dims of depth 1; any other dim is free."""
        return {d: DimUse(DimRole.HALO, HALO) for d in laplacian_dims(da, dims)}

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """One task per chunk: its padded input and its output, until calibrated.

        The analytic model: the padded block (1 x the input bytes) and the result of the
        padded block's shape (1 x the output bytes); the neighbours are added in place, with
        no temporaries. Calibrated in a worker: 2.0 x the padded input bytes, no fixed cost
        (``laplacian-cpu.json``).
        """
        model = LinearMemoryModel({"input_bytes": 1.0, "output_bytes": 1.0})
        return Cost(
            self.name,
            input_output_features(np.dtype(da.dtype).itemsize),
            model,
            seconds_per_element=5e-9,
        )

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, int]]]:
        """The arguments as given; blocks of 65 thousand to 24 million elements, one 3-D."""
        sizes = [
            (256, 256),
            (512, 384),
            (1024, 1024),
            (2048, 1024),
            (1500, 3000),
            (2048, 2048),
            (3000, 2500),
            (4096, 2048),
            (4096, 4096),
            (6000, 4000),
        ]
        shapes = [{"y": a, "x": b} for a, b in sizes] + [{"time": 8, "y": 1000, "x": 1000}]
        return self.check_arguments(kwargs), shapes

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """The Laplacian of ``da``, lazily: one task per chunk with its halo."""
        axes = tuple(da.get_axis_num(d) for d in laplacian_dims(da, kwargs.get("dims")))
        depth = {axis: uses[da.dims[axis]].depth for axis in axes}
        data = map_blocks_with_halo(da.data, laplacian_on_axes, depth, da.dtype, axes=axes)
        return xr.DataArray(data, dims=da.dims, coords=da.coords, name=da.name)


#: Registered as a built-in operator (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (Laplacian(),)

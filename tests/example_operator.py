"""A minimal operator to copy: a moving average along one dim, with a halo.

An operator says three things: which dims it needs and how (:meth:`dims`), what one task
costs in memory (:meth:`cost`), and how to compute it lazily (:meth:`compute`).
``tests/test_example_operator.py`` registers, plans and applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xarray as xr
from scipy.ndimage import uniform_filter1d

import xarray_memchunk as xm
from xarray_memchunk.operators.sources import map_blocks_with_halo


class MovingAverage(xm.Operator):
    """Mean of ``window`` neighbours along ``dim``, the nearest value repeated at the edges.

    Keyword Arguments:
    -----------------
    dim : str
        The dim to average along (default ``"x"``).
    window : int
        An odd number of elements (default 3).
    """

    name = "example-moving-average"
    description = "moving average over dim= (window= elements), halo window // 2"
    dtype_kinds = "f"  # float data only: the plan refuses others, naming the dtype

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Fill in the defaults and refuse wrong arguments, before anything runs."""
        kwargs = {"dim": "x", "window": 3} | dict(kwargs)
        if set(kwargs) != {"dim", "window"} or kwargs["window"] % 2 != 1:
            raise xm.MemchunkError(f"{self.name} takes dim= and an odd window=, got {kwargs}")
        return kwargs

    def dims(
        self, da: xr.DataArray, dim: str = "x", window: int = 3, **kw: Any
    ) -> dict[str, xm.DimUse]:
        """``dim`` is a halo dim: each task reads ``window // 2`` elements of each neighbour.

        Dims left out are free: the planner chunks them as it likes.
        """
        if dim not in da.dims:
            raise xm.DimensionError(f"{self.name} needs dim {dim!r}, not in {tuple(da.dims)}")
        return {dim: xm.DimUse(xm.DimRole.HALO, window // 2)}

    def cost(self, da: xr.DataArray, **kw: Any) -> xm.Cost:
        """One task holds its padded input and its output: 1 + 1 bytes per input byte.

        ``input_output_features`` turns a task's padded extents into ``input_bytes`` and
        ``output_bytes``; the model weighs them. ``memchunk calibrate`` can fit it later.
        """
        model = xm.LinearMemoryModel({"input_bytes": 1.0, "output_bytes": 1.0})
        return xm.Cost(self.name, xm.input_output_features(da.dtype.itemsize), model)

    def compute(
        self,
        da: xr.DataArray,
        uses: Mapping[str, xm.DimUse],
        dim: str = "x",
        window: int = 3,
        **kw: Any,
    ) -> xr.DataArray:
        """The lazy result, one task per planned chunk.

        The halo rule: read halos with ``map_blocks_with_halo`` (never ``map_overlap`` or
        ``.rolling()``), which reads each padded block straight from the file for file data.
        """
        axis = da.get_axis_num(dim)
        data = map_blocks_with_halo(
            da.data,
            uniform_filter1d,  # called on each padded block; the halo is trimmed after
            {axis: uses[dim].depth},
            da.dtype,
            size=window,
            axis=axis,
            mode="nearest",
        )
        return da.copy(data=data)

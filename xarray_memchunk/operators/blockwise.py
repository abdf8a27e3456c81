"""A ready-made operator for any numpy function applied chunk by chunk, with optional halos."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import DimensionError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .base import DimUse, Operator
from .sources import map_blocks_with_halo

__all__ = ["BlockwiseOperator"]


class BlockwiseOperator(Operator):
    """Wrap a numpy function ``func(block, **kwargs) -> block`` of the same shape as an operator.

    Parameters
    ----------
    name
        Name to register it under.
    func
        Called on each (padded) numpy block; must return an array of the block's shape.
    memory_model
        Peak bytes of one task from ``input_bytes`` and ``output_bytes``; give what you
        measured (or calibrate it with :func:`xarray_memchunk.calibrate`).
    depth
        Halo depth per dim name: each task sees that many neighbour elements per side
        (``dask.array.map_overlap`` with ``boundary="none"``).
    whole
        Dims that must be one chunk.
    output_dtype
        dtype of the result (the input's by default).
    description
        One line for :func:`xarray_memchunk.operator_names`.
    devices
        Where ``func`` runs: ``("cpu",)`` for NumPy blocks; add ``"gpu"`` when it also takes
        CuPy blocks (the plan is then budgeted against the GPU's memory for CuPy data).

    Examples
    --------
    >>> from scipy import ndimage
    >>> smooth = BlockwiseOperator(
    ...     "smooth", lambda b: ndimage.uniform_filter(b, 5),
    ...     memory_model=LinearMemoryModel({"input_bytes": 2.0, "output_bytes": 1.0}),
    ...     depth={"x": 2, "y": 2})
    """

    def __init__(
        self,
        name: str,
        func: Callable[..., np.ndarray],
        *,
        memory_model: LinearMemoryModel,
        depth: Mapping[str, int] | None = None,
        whole: Sequence[str] = (),
        output_dtype: np.dtype | str | None = None,
        description: str = "",
        devices: Sequence[str] = ("cpu",),
    ) -> None:
        self.name = name
        self.func = func
        self.memory_model = memory_model
        self.depth = dict(depth or {})
        self.whole = tuple(whole)
        self.output_dtype = np.dtype(output_dtype) if output_dtype is not None else None
        self.description = description or f"user blockwise operator {name!r}"
        self.devices = tuple(devices)

    def dim_uses(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Whole dims and halo dims as declared; each must exist in ``da``."""
        missing = [d for d in (*self.depth, *self.whole) if d not in da.dims]
        if missing:
            raise DimensionError(
                f"operator {self.name!r} needs dims {missing}, missing from dims {tuple(da.dims)}"
            )
        uses = {d: DimUse(DimRole.HALO, int(k)) for d, k in self.depth.items()}
        uses.update({d: DimUse(DimRole.WHOLE) for d in self.whole})
        return uses

    def output_itemsize(self, itemsize: int, **kwargs: Any) -> int:
        """Bytes per output element."""
        return self.output_dtype.itemsize if self.output_dtype is not None else itemsize

    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """The model given at construction."""
        return self.memory_model

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply ``func`` block by block (with halos where declared), lazily."""
        dtype = self.output_dtype or da.dtype
        depth = {da.get_axis_num(d): u.depth for d, u in uses.items() if u.role is DimRole.HALO}
        data = map_blocks_with_halo(da.data, self.func, depth, dtype, **kwargs)
        if not hasattr(data, "dask"):  # NumPy data: computed now
            data = np.asarray(data).astype(dtype, copy=False)
        return da.copy(data=data)

"""Any NumPy function applied chunk by chunk (with halos where declared), as an operator.

Without a memory model, the operator calibrates itself on its first plan
(:func:`xarray_memchunk.calibrate.self_calibrate`): its tasks are measured in a Dask worker on a
few growing blocks of the data's dtype, and the fit is saved as a user calibration named after
the function's identity and source, so a changed function is measured again.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import CalibrationError, DimensionError, MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .base import CostTerms, DimUse, Operator
from .sources import map_blocks_with_halo

__all__ = ["BlockwiseOperator", "function_identity"]


def function_identity(func: Callable[..., Any], *details: Any) -> str:
    """A short, stable digest of ``func`` (module, name and source) and ``details``.

    Functions whose source cannot be read (built in, or defined where ``inspect`` finds no
    file) are identified by their compiled code and constants.
    """
    target = getattr(func, "func", func)  # functools.partial
    try:
        body = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        body = repr((code.co_code, code.co_consts)) if code is not None else repr(target)
    text = "|".join(
        [
            getattr(target, "__module__", "") or "",
            getattr(target, "__qualname__", "") or "",
            body,
            repr(getattr(func, "keywords", None)),
            *map(repr, details),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class BlockwiseOperator(Operator):
    """Wrap a NumPy function ``func(block, **kwargs) -> array`` as an operator.

    Parameters
    ----------
    name
        Name to register it under.
    func
        Called on each (padded) NumPy block; returns the block's shape, less ``drop_dims``,
        plus ``new_dims`` at the end.
    memory_model
        Peak bytes of one task from ``input_bytes`` and ``output_bytes``. Leave it out and the
        operator measures itself on its first plan (a few seconds) and plans with the fit.
    depth
        Halo depth per dim name: each task sees that many neighbour elements per side
        (``dask.array.map_overlap`` with ``boundary="none"``).
    whole
        Dims that must be one chunk.
    dtype
        dtype of the result (the input's by default).
    drop_dims
        Dims ``func`` removes (reduces over); they are kept whole.
    new_dims
        Dims ``func`` adds after the others, with their lengths.
    description
        One line for :func:`xarray_memchunk.operator_names`.
    devices
        Where ``func`` runs: ``("cpu",)`` for NumPy blocks; add ``"gpu"`` when it also takes
        CuPy blocks (the plan is then budgeted against the GPU's memory for CuPy data).

    Examples
    --------
    >>> from scipy import ndimage
    >>> smooth = BlockwiseOperator(
    ...     "smooth", lambda b: ndimage.uniform_filter(b, 5), depth={"x": 2, "y": 2}
    ... )
    """

    def __init__(
        self,
        name: str,
        func: Callable[..., np.ndarray],
        *,
        memory_model: LinearMemoryModel | None = None,
        depth: Mapping[str, int] | None = None,
        whole: Sequence[str] = (),
        dtype: np.dtype | str | None = None,
        drop_dims: Sequence[str] = (),
        new_dims: Mapping[str, int] | None = None,
        description: str = "",
        devices: Sequence[str] = ("cpu",),
    ) -> None:
        if not callable(func):
            raise MemchunkError(f"operator {name!r} needs a function, got {func!r}")
        self.name = name
        self.func = func
        self.memory_model = memory_model
        self.depth = {str(d): int(k) for d, k in (depth or {}).items()}
        self.drop_dims = tuple(map(str, drop_dims))
        self.new_dims = {str(d): int(n) for d, n in (new_dims or {}).items()}
        self.whole = tuple(dict.fromkeys((*map(str, whole), *self.drop_dims)))
        self.output_dtype = np.dtype(dtype) if dtype is not None else None
        self.description = description or f"user blockwise operator {name!r}"
        self.devices = tuple(devices)
        if self.depth and (self.drop_dims or self.new_dims):
            raise MemchunkError(
                f"operator {name!r}: a function with a halo must return its block's shape; "
                f"drop_dims and new_dims need depth=None"
            )
        if any(k < 0 for k in self.depth.values()):
            raise MemchunkError(f"operator {name!r}: halo depths must be >= 0, got {depth!r}")
        #: Calibration file of this function (its identity and declared shape).
        shape = (self.depth, self.whole, dtype, self.drop_dims, self.new_dims)
        self.calibration = f"{name}-{function_identity(func, *shape)}"

    @property
    def self_calibrating(self) -> bool:
        """Whether the operator measures its own memory model (no ``memory_model`` given)."""
        return self.memory_model is None

    def dim_uses(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Whole dims and halo dims as declared; each must exist in ``da``."""
        missing = [d for d in (*self.depth, *self.whole) if d not in da.dims]
        if missing:
            raise DimensionError(
                f"operator {self.name!r} needs dims {missing}, missing from dims {tuple(da.dims)}"
            )
        uses = {d: DimUse(DimRole.HALO, k) for d, k in self.depth.items()}
        uses.update({d: DimUse(DimRole.WHOLE) for d in self.whole})
        return uses

    def task_features(self, extents, uses, itemsize, sizes=None, **kwargs):
        """Input bytes; output bytes of the kept dims and the new ones."""
        elements = np.prod([np.asarray(v, dtype=np.float64) for v in extents.values()], axis=0)
        kept = [
            np.asarray(v, dtype=np.float64) for d, v in extents.items() if d not in self.drop_dims
        ]
        out = np.prod(kept, axis=0) if kept else np.ones_like(elements)
        out = out * float(np.prod(list(self.new_dims.values()) or [1]))
        return {
            "input_bytes": elements * itemsize,
            "output_bytes": out * self.output_itemsize(itemsize),
        }

    def output_itemsize(self, itemsize: int, **kwargs: Any) -> int:
        """Bytes per output element."""
        return self.output_dtype.itemsize if self.output_dtype is not None else itemsize

    def cost_terms(self, **kwargs: Any) -> CostTerms:
        """Calibrated under the function's own identity (a changed function, a new file)."""
        return CostTerms(self.calibration)

    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """The model given at construction.

        Raises
        ------
        CalibrationError
            When none was given and the operator has not calibrated itself for this dtype.
        """
        if self.memory_model is None:
            raise CalibrationError(
                f"operator {self.name!r} has no memory model for {np.dtype(array_dtype)} yet: "
                f"plan it (it calibrates itself) or run xarray_memchunk.calibrate"
            )
        return self.memory_model

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply ``func`` block by block (with halos where declared), lazily."""
        dtype = self.output_dtype or da.dtype
        if self.drop_dims or self.new_dims:
            return self._reshaping(da, dtype, **kwargs)
        depth = {da.get_axis_num(d): u.depth for d, u in uses.items() if u.role is DimRole.HALO}
        data = map_blocks_with_halo(da.data, self.func, depth, dtype, **kwargs)
        if not hasattr(data, "dask"):  # NumPy data: computed now
            data = np.asarray(data).astype(dtype, copy=False)
        return da.copy(data=data)

    def _reshaping(self, da: xr.DataArray, dtype: np.dtype, **kwargs: Any) -> xr.DataArray:
        """``func`` that drops or adds dims: one task per chunk, the dropped dims whole."""
        kept = [d for d in da.dims if d not in self.drop_dims]
        dims = [*kept, *self.new_dims]
        coords = {k: v for k, v in da.coords.items() if set(v.dims) <= set(kept)}
        if not hasattr(da.data, "dask"):
            data = np.asarray(self.func(np.asarray(da.data), **kwargs)).astype(dtype, copy=False)
            return xr.DataArray(data, dims=dims, coords=coords, name=da.name)
        axes = [da.get_axis_num(d) for d in self.drop_dims]
        chunks = [c for d, c in zip(da.dims, da.data.chunks, strict=True) if d in kept]
        chunks += [(n,) for n in self.new_dims.values()]
        data = da.data.map_blocks(
            self.func,
            dtype=dtype,
            drop_axis=axes,
            new_axis=list(range(len(kept), len(dims))) if self.new_dims else None,
            chunks=tuple(chunks),
            meta=np.empty((0,) * len(dims), dtype=dtype),
            **kwargs,
        )
        return xr.DataArray(data, dims=dims, coords=coords, name=da.name)


def operator(
    name: str | None = None,
    *,
    depth: Mapping[str, int] | None = None,
    whole: Sequence[str] = (),
    dtype: np.dtype | str | None = None,
    drop_dims: Sequence[str] = (),
    new_dims: Mapping[str, int] | None = None,
    memory_model: LinearMemoryModel | None = None,
    description: str = "",
    register: bool = True,
) -> Callable[[Callable[..., np.ndarray]], BlockwiseOperator]:
    """Decorate a NumPy block function to make it a (self-calibrating) operator.

    Takes :class:`BlockwiseOperator`'s arguments; the name defaults to the function's. The
    operator is registered (replacing one of the same name, so a notebook cell can be run
    again) unless ``register=False``.

    Examples
    --------
    >>> @operator(depth={"inline": 2, "crossline": 2, "sample": 2})
    ... def smoothed(block):
    ...     return scipy.ndimage.uniform_filter(block, 5)
    >>> dip = volume.memchunk.apply(smoothed)      # doctest: +SKIP
    """

    def wrap(func: Callable[..., np.ndarray]) -> BlockwiseOperator:
        from .registry import register_operator

        op = BlockwiseOperator(
            name or func.__name__,
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

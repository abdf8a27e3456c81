"""Any NumPy function applied chunk by chunk (with halos where declared), as an operator.

Without a memory model, the operator calibrates itself on its first plan
(:func:`~xarray_memchunk.measure.self_calibration.self_calibrate`): its tasks are measured in a
Dask worker on a few growing blocks of the data's dtype, and the fit is saved as a user
calibration named after the function's identity (:mod:`~xarray_memchunk.operators.identity`:
its code, what it closes over, its bound object and its keyword arguments), so a changed
function is measured again.

Before anything runs, the function is called once on a small block of ones (a probe): a
function that does not return an array of the expected shape is refused, and the lazy result
takes the dtype the probe returned. Each block's result is checked the same way at compute.
"""

from __future__ import annotations

import functools
import inspect
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import dask.base
import dask.utils
import numpy as np
import xarray as xr

from ..errors import DimensionError, MemchunkError
from ..models import LinearMemoryModel
from ..planning.problem import DimRole, Halo, halo_sides, widest_halo
from .base import Cost, DimUse, Operator, padded_elements
from .graph_values import call_with, once_in_graph
from .halo_reach import check_reach, checking
from .identity import Identity, arguments_identity, calibration_key, identify
from .sources import map_blocks_with_halo

__all__ = ["BlockwiseOperator", "CheckedBlockFunction", "function_identity", "function_name"]

#: Elements of the probe block per dim, beyond its halo (both sides).
PROBE_LENGTH = 8


def function_identity(func: Callable[..., Any], *details: Any) -> str:
    """A short, stable digest of ``func`` (code, closure, defaults, bound state) and ``details``.

    See :func:`~xarray_memchunk.operators.identity.identify`, which also says whether the digest
    can be trusted.
    """
    return identify(func, *details).digest[:12]


def function_name(func: Callable[..., Any]) -> str | None:
    """``func.__name__``, looking through ``functools.partial``; None for a nameless callable."""
    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else None


def _returned(value: Any) -> str:
    """What a user function returned, in words."""
    if value is None:
        return "None (does it lack a return statement?)"
    if _is_array(value):
        return f"a {np.dtype(value.dtype)} array of shape {tuple(value.shape)}"
    if isinstance(value, np.generic):
        return f"a scalar ({type(value).__name__})"
    return f"a {type(value).__name__}"


def _is_array(value: Any) -> bool:
    """Whether ``value`` is an array a Dask block may hold (NumPy, CuPy, ...), not a scalar."""
    return not isinstance(value, np.generic) and all(
        hasattr(value, a) for a in ("shape", "dtype", "__array_function__")
    )


class CheckedBlockFunction:
    """``func`` applied to one block, its result checked, and cast to the declared dtype.

    A result that is not an array of the expected shape (the block's, less ``drop_axes``, plus
    ``new_lengths`` at the end), or, with no dtype declared, not of the lazy result's dtype,
    raises a :class:`MemchunkError` that names the function and what it returned.

    Parameters
    ----------
    operator
        Name of the operator, for messages.
    func
        The user's block function.
    dtype
        dtype of the lazy result; None checks the shape only.
    declared
        Whether the user declared ``dtype``: blocks of another dtype are then cast to it.
    drop_axes
        Axes of the block that ``func`` removes.
    new_lengths
        Lengths of the axes that ``func`` adds after the others.
    """

    def __init__(
        self,
        operator: str,
        func: Callable[..., Any],
        dtype: np.dtype | None,
        *,
        declared: bool = False,
        drop_axes: Sequence[int] = (),
        new_lengths: Sequence[int] = (),
    ) -> None:
        self.operator = operator
        self.func = func
        self.dtype = np.dtype(dtype) if dtype is not None else None
        self.declared = declared
        self.drop_axes = tuple(drop_axes)
        self.new_lengths = tuple(new_lengths)
        self.__name__ = dask.utils.funcname(func)  # the graph's layers are named as before

    def __call__(self, block: Any, **kwargs: Any) -> Any:
        """``func(block, **kwargs)``, checked (and cast to a declared dtype).

        Where the function raises as xarray code does on a NumPy array (``x.mean("time")``:
        a dim's name where an axis goes; ``x.groupby``: an attribute the array lacks), the
        error keeps its type and gains a note saying that the function is given NumPy blocks,
        and how to give it DataArrays.
        """
        try:
            out = self.check(block, self.func(block, **kwargs))
        except (TypeError, AttributeError) as exc:
            if not _as_if_given_xarray(exc, block):
                raise
            note = (
                f"operator {self.operator!r}: {self._function} is given NumPy blocks (its "
                f"first parameter is not annotated xr.DataArray). For a function of xarray "
                f"objects, annotate it (def f(x: xr.DataArray)) or declare "
                f"@xm.operator(xarray=True, whole=[...])"
            )
            if note not in getattr(exc, "__notes__", ()):
                exc.add_note(note)
            raise
        if self.dtype is None or out.dtype == self.dtype:
            return out
        if not self.declared:
            raise MemchunkError(
                f"operator {self.operator!r}: {self._function} returned a {out.dtype} block "
                f"where its result was planned as {self.dtype}: declare the result's dtype "
                f"with dtype=..."
            )
        return out.astype(self.dtype, copy=False)

    def check(self, block: Any, out: Any) -> Any:
        """``out`` when it is an array of the shape expected for ``block``.

        Raises
        ------
        MemchunkError
            Naming the function, what it returned and what was expected.
        """
        kept = [n for axis, n in enumerate(block.shape) if axis not in self.drop_axes]
        expected = (*kept, *self.new_lengths)
        if _is_array(out) and tuple(out.shape) == expected:
            return out
        raise MemchunkError(
            f"operator {self.operator!r}: {self._function} returned {_returned(out)} for a "
            f"{np.dtype(block.dtype)} block of shape {tuple(block.shape)}; it must return an "
            f"array of shape {expected} (the block's shape, less drop_dims, plus new_dims at "
            f"the end)"
        )

    @property
    def _function(self) -> str:
        name = function_name(self.func)
        return f"function {name!r}" if name else "its function"

    def __dask_tokenize__(self) -> tuple:
        dtype = self.dtype.str if self.dtype is not None else None
        func = dask.base.tokenize(self.func)
        return (type(self).__name__, func, dtype, self.declared, self.drop_axes, self.new_lengths)


def _as_if_given_xarray(exc: Exception, block: Any) -> bool:
    """Whether ``exc`` is what xarray code raises on ``block``, a NumPy (or CuPy) array.

    A method the array lacks (``'numpy.ndarray' object has no attribute 'groupby'``), or a
    dim's name where NumPy takes an axis (``'str' object cannot be interpreted as an
    integer``); not another argument's error (``'list' object has no attribute 'size'``).
    """
    said = str(exc)
    if isinstance(exc, AttributeError):
        return f"{type(block).__name__}' object has no attribute" in said
    return "'str' object cannot be interpreted as an integer" in said


def probe_dtype(
    checked: CheckedBlockFunction, block: np.ndarray, kwargs: Mapping[str, Any]
) -> np.dtype | None:
    """The dtype ``checked.func`` returns for ``block``; None when the function raised.

    A function that raises on a small block of ones may still work on real blocks: it is then
    checked at compute only.

    Raises
    ------
    MemchunkError
        When the function returns something other than an array of the expected shape.
    """
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = checked.func(block, **kwargs)
    except Exception:  # the user's function failed on the probe: checked at compute instead
        return None
    return np.dtype(checked.check(block, out).dtype)


def _block_features(
    padded: Mapping[str, np.ndarray],
    itemsize: int,
    out_itemsize: int,
    drop_dims: Sequence[str],
    new_elements: float,
) -> dict[str, np.ndarray]:
    """Input bytes; output bytes of the dims kept and of ``new_elements`` per element kept."""
    elements = padded_elements(padded)
    kept = [np.asarray(v, dtype=np.float64) for d, v in padded.items() if d not in drop_dims]
    out = np.prod(kept, axis=0) if kept else np.ones_like(elements)
    out = out * new_elements
    return {"input_bytes": elements * itemsize, "output_bytes": out * out_itemsize}


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
        (``dask.array.map_overlap`` with ``boundary="none"``), or ``(before, after)`` where
        the sides differ (a trailing moving window: ``(window - 1, 0)``).
    whole
        Dims that must be one chunk.
    dtype
        dtype of the result: each block is cast to it. Left out, the dtype the function
        returns for a small probe block (the input's when the probe raised).
    drop_dims
        Dims ``func`` removes (reduces over); they are kept whole.
    new_dims
        Dims ``func`` adds after the others, with their lengths.
    description
        One line for :func:`xarray_memchunk.operator_names`.
    devices
        Where ``func`` runs: ``("cpu",)`` for NumPy blocks; add ``"gpu"`` when it also takes
        CuPy blocks (the plan is then budgeted against the GPU's memory for CuPy data).

    Attributes
    ----------
    calibration
        Name its self-calibration is saved under: the name and the function's identity
        (:mod:`~xarray_memchunk.operators.identity`); unique to this object where the
        identity is unknown, so that no other function's calibration is used.
    identity_known
        False when a value the function depends on (closed over, bound, a default, a global of
        its module) could not be hashed stably: its calibration is then never shared.
    identity_reason
        Which value, and why; empty when the identity is known.

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
        depth: Mapping[str, Halo] | None = None,
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
        for dim, k in (depth or {}).items():
            try:
                halo_sides(k)
            except ValueError as exc:
                raise MemchunkError(f"operator {name!r}: depth of {dim!r}: {exc}") from None
        self.depth = {str(d): widest_halo(k, 0) for d, k in (depth or {}).items()}
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
        result = (self.output_dtype.str if self.output_dtype is not None else None, self.new_dims)
        identity = identify(func, self.depth, self.whole, self.drop_dims, *result)
        self.identity_known = identity.known
        self.identity_reason = identity.reason
        digest = identity.digest if identity.known else uuid.uuid4().hex
        self.calibration = f"{name}-{digest[:12]}"
        self._probed: dict[tuple, np.dtype | None] = {}
        self._reach_checked: set[tuple] = set()  # dtype, sizes and arguments checked

    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Whole dims and halo dims as declared; each must exist in ``da``."""
        missing = [d for d in (*self.depth, *self.whole) if d not in da.dims]
        if missing:
            raise DimensionError(
                f"operator {self.name!r} needs dims {missing}, missing from dims {tuple(da.dims)}"
            )
        uses = {d: DimUse(DimRole.HALO, k) for d, k in self.depth.items()}
        uses.update({d: DimUse(DimRole.WHOLE) for d in self.whole})
        return uses

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """The model given, or none: the function is measured (it is :attr:`Cost.measurable`).

        Features: input bytes; output bytes of the kept dims and the new ones, in the declared
        dtype (the input's when none is declared). Calibrated under :attr:`calibration` and a
        digest of the keyword arguments' content
        (:func:`~xarray_memchunk.operators.identity.calibration_key`); in doubt where
        either identity is unknown.
        """
        itemsize = np.dtype(da.dtype).itemsize
        features = functools.partial(
            _block_features,
            itemsize=itemsize,
            out_itemsize=self.output_dtype.itemsize if self.output_dtype is not None else itemsize,
            drop_dims=self.drop_dims,
            new_elements=float(np.prod(list(self.new_dims.values()) or [1])),
        )
        key, doubt = calibration_key(self.calibration, self.func, kwargs, self.identity_reason)
        return Cost(key, features, self.memory_model, measurable=True, identity_doubt=doubt)

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check ``func(block, **kwargs)`` against its signature; then probe it on ``da``.

        With ``da``: its dims are checked and the function is called on a small block of its
        dtype (:meth:`result_dtype`).

        Raises
        ------
        MemchunkError
            When the function does not take these keyword arguments (or needs others), or
            returns something other than an array of the expected shape.
        DimensionError
            When ``da`` lacks a dim the operator needs.
        """
        if da is not None:
            self.dims(da)
            # a dtype it does not compute on is refused by its cost, and never called on (a
            # new user's detrend was called on a Dataset's cftime time_bnds, and failed)
            if da.dtype.kind in self.dtype_kinds:
                self.result_dtype(da, kwargs)
                self._check_reach(da, kwargs)
            return dict(kwargs)
        try:
            signature = inspect.signature(self.func)
        except (TypeError, ValueError):  # no signature to check (some built-in functions)
            return dict(kwargs)
        try:
            signature.bind(None, **kwargs)
        except TypeError as exc:
            call = ", ".join(["block", *(f"{k}=..." for k in kwargs)])
            raise MemchunkError(
                f"operator {self.name!r} calls its function as "
                f"{function_name(self.func) or 'func'}({call}), which fails: {exc}; the "
                f"function's signature is {signature}: pass only the keyword arguments it takes"
            ) from None
        return dict(kwargs)

    def result_dtype(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> np.dtype:
        """The result's dtype: declared, else the probe's, else the input's."""
        probed = self._probe(da, kwargs)
        if self.output_dtype is not None:
            return self.output_dtype
        return probed if probed is not None else np.dtype(da.dtype)

    def _probe(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> np.dtype | None:
        """The dtype ``func`` returns for a small block of ones (halo included), remembered."""
        shape = tuple(
            min(n, sum(halo_sides(self.depth.get(str(d), 0))) + PROBE_LENGTH)
            for d, n in da.sizes.items()
        )
        arguments = self.argument_identity(**kwargs)
        key = (np.dtype(da.dtype).str, shape, arguments.digest)
        if key in self._probed:
            return self._probed[key]
        if 0 in shape:
            return None
        block = np.ones(shape, dtype=da.dtype)
        probed = probe_dtype(self._checked(da, None), block, kwargs)
        if arguments.known:
            self._probed[key] = probed
        return probed

    def _check_reach(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> None:
        """Refuse a function that reads further than its halo along a dim plans may cut.

        See :func:`~.halo_reach.check_reach`; done once per dtype, trial shape and arguments.
        """
        sizes = {str(d): int(n) for d, n in da.sizes.items()}
        cut = {d: self.depth.get(d, 0) for d in sizes if d not in self.whole}
        arguments = self.argument_identity(**kwargs)
        key = (np.dtype(da.dtype).str, tuple(sizes.items()), arguments.digest)
        if key in self._reach_checked or not checking():
            return
        kept = [d for d in sizes if d not in self.drop_dims]
        check_reach(self.func, sizes, np.dtype(da.dtype), cut, kwargs, self.name, kept)
        if arguments.known:
            self._reach_checked.add(key)

    def _checked(self, da: xr.DataArray, dtype: np.dtype | None) -> CheckedBlockFunction:
        return CheckedBlockFunction(
            self.name,
            self.func,
            dtype,
            declared=self.output_dtype is not None,
            drop_axes=[da.get_axis_num(d) for d in self.drop_dims],
            new_lengths=list(self.new_dims.values()),
        )

    def argument_identity(self, **kwargs: Any) -> Identity:
        """Identity of the function's keyword arguments (``identity.arguments_identity``)."""
        return arguments_identity(self.func, kwargs)

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply ``func`` block by block (with halos where declared), lazily, checked."""
        checked = self._checked(da, self.result_dtype(da, kwargs))
        if self.drop_dims or self.new_dims:
            return self._reshaping(da, checked, **kwargs)
        depth = {da.get_axis_num(d): u.depth for d, u in uses.items() if u.role is DimRole.HALO}
        data = map_blocks_with_halo(da.data, checked, depth, checked.dtype, **kwargs)
        if not hasattr(data, "dask"):  # NumPy data: computed now
            data = np.asarray(data)
        result = da.copy(data=data)
        # new values: the input's encoding (a packed int16's scale_factor, its _FillValue)
        # would store them wrongly, and xarray's computations drop it too
        result.encoding = {}
        return result

    def _reshaping(
        self, da: xr.DataArray, checked: CheckedBlockFunction, **kwargs: Any
    ) -> xr.DataArray:
        """``func`` that drops or adds dims: one task per chunk, the dropped dims whole."""
        kept = [d for d in da.dims if d not in self.drop_dims]
        dims = [*kept, *self.new_dims]
        coords = {k: v for k, v in da.coords.items() if set(v.dims) <= set(kept)}
        if not hasattr(da.data, "dask"):
            data = np.asarray(checked(np.asarray(da.data), **kwargs))
            return xr.DataArray(data, dims=dims, coords=coords, name=da.name)
        chunks = [c for d, c in zip(da.dims, da.data.chunks, strict=True) if d in kept]
        chunks += [(n,) for n in self.new_dims.values()]
        token = dask.base.tokenize(da.data.name, checked, kwargs)
        data = da.data.map_blocks(
            call_with,
            **once_in_graph({"function": checked, "arguments": kwargs}, f"memchunk-call-{token}"),
            dtype=checked.dtype,
            drop_axis=list(checked.drop_axes),
            new_axis=list(range(len(kept), len(dims))) if self.new_dims else None,
            chunks=tuple(chunks),
            meta=np.empty((0,) * len(dims), dtype=checked.dtype),
            name=f"{checked.__name__}-{token}",
        )
        return xr.DataArray(data, dims=dims, coords=coords, name=da.name)

"""Any function of an xarray object (a climatology, a resample, a rolling mean...) as an operator.

``func(obj, **kwargs)`` takes a DataArray and returns a DataArray or a Dataset, written with
xarray's own methods: ``obj.groupby("time.month").mean()``, ``obj.resample(time="1MS").mean()``,
``obj.rolling(time=30, center=True).mean()``, ``obj.polyfit("time", 1)``, or a chain of them.
The dims it needs whole (``whole=["time"]``, or every dim but ``free=[...]``) are one chunk in
every task; the plan cuts the others. Each task rebuilds its block as a DataArray, with its
part of each coordinate, and calls ``func`` on it once (a blockwise task, into which a read
from a file fuses, as for the other operators; each output is then taken from its result). A
per-location computation gives the same result as the expression run by xarray on the whole
array, and a task holds what one call of ``func`` on one block holds: what is measured.

With no memory model given, the operator measures itself on its first plan, as a NumPy block
function does (:func:`~xarray_memchunk.measure.self_calibration.self_calibrate`): ``func``
runs on growing blocks of the data's dtype, with the data's own coordinates along the whole dims (so
that ``groupby("time.month")`` finds its months), and the fit is saved under the function's
identity (:mod:`~xarray_memchunk.operators.identity`).

The result's structure (its dims, coordinates, dtype) is found by calling ``func`` once on a
sample of ones: the whole dims entire, two elements of each dim the plan may cut. ``func``
must not reduce over those (declare them whole).
"""

from __future__ import annotations

import functools
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import DimensionError, MemchunkError, warn_at_caller
from ..models import LinearMemoryModel
from ..planning.problem import DimRole
from .base import Cost, DimUse, Operator, padded_elements
from .dims import resolve_dim
from .graph_values import once_in_graph
from .halo_reach import check_free_dims, checking, piece_of
from .identity import arguments_identity, calibration_key, identify
from .sources import file_backend

__all__ = ["XarrayFunctionOperator", "takes_xarray"]


def _input_features(padded: Mapping[str, np.ndarray], itemsize: int) -> dict[str, np.ndarray]:
    """The task's input bytes (what the function makes of a block grows with them)."""
    elements = padded_elements(padded)
    return {"input_bytes": elements * itemsize}


def _on_block(
    source: Any,
    *,
    function: Callable[..., Any],
    arguments: Mapping[str, Any],
    dims: tuple[str, ...],
    coords: Mapping[str, tuple[tuple[str, ...], np.ndarray]],
    name_: Any,
    orders: Mapping[Any, tuple[str, ...]],
    free: tuple[str, ...] = (),
    bounds: Mapping[str, tuple[int, ...]] | None = None,
    block_info: Mapping[Any, Any] | None = None,
) -> np.ndarray:
    """``function`` on one block, rebuilt as a DataArray with its part of each coordinate.

    ``source`` is the block, or a file's backend array to read it from: the block of task
    ``block_info[None]["chunk-location"]`` (an index per free dim) within ``bounds`` (each
    dim's chunk boundaries). Returns a one-element object array holding ``{output name: NumPy
    array, dims in its order}`` (the name None for a DataArray result).
    """
    if bounds is None:
        block = source
        location = dict(zip(dims, block_info[0]["array-location"], strict=True))
    else:
        index = dict(zip(free, block_info[None]["chunk-location"], strict=True))
        location = {
            d: (b[index[d]], b[index[d] + 1]) if d in index else (0, b[-1])
            for d, b in bounds.items()
        }
        block = np.asarray(source[tuple(slice(*location[d]) for d in dims)])
    own = {k: (d, v[tuple(slice(*location[dim]) for dim in d)]) for k, (d, v) in coords.items()}
    given = xr.DataArray(block, dims=dims, coords=own, name=name_)
    out = function(given, **arguments)
    arrays = {}
    for name, order in orders.items():
        array = out if name is None else out[name]
        # a coordinate the function made along some of the free dims: along all of them
        missing = {d: given.sizes[d] for d in order if d not in array.dims}
        array = array.expand_dims(missing)
        changed = [d for d in free if array.sizes[d] != given.sizes[d]]
        if changed:  # in this block only (dropped labels inside it): the sample could not tell
            raise MemchunkError(
                f"the function changed the length of {changed} in a task "
                f"({', '.join(f'{given.sizes[d]} -> {array.sizes[d]}' for d in changed)}), "
                f"which the plan cuts: declare {changed} whole"
            )
        arrays[name] = np.asarray(array.transpose(*order).data)
    held = np.empty((1,) * len(block_info[None]["chunk-shape"]), dtype=object)
    held.flat[0] = arrays
    return held


def _changed_along(out: xr.DataArray, sample: xr.DataArray, dim: Any) -> str:
    """How ``out`` (the function of ``sample``) changes ``dim``, in words; "" where it does not.

    Its length (a selection, a coarsening), or its labels (a sort, a roll, new longitudes).
    """
    before, after = sample.sizes[dim], out.sizes[dim]
    if after != before:
        return (
            f"changes the length of {dim!r} ({after} of {before} elements of a sample: a "
            f"selection or a coarsening)"
        )
    if dim in out.indexes and dim not in sample.indexes:
        return f"gives {dim!r} labels of its own, where it had none"
    if dim in sample.indexes and dim in out.indexes:
        labels, made = sample.indexes[dim], out.indexes[dim]
        if not labels.equals(made):
            return (
                f"changes the labels of {dim!r} ({list(labels)} become {list(made)}: a sort, a "
                f"roll or new coordinates)"
            )
    return ""


def _same_coord(made: xr.DataArray, given: xr.DataArray | None) -> bool:
    """Whether the function's coordinate ``made`` is the sample's ``given`` as it was."""
    return given is not None and made.variable.equals(given.variable)


def _take(results: np.ndarray, *, variable: Any) -> np.ndarray:
    """Output ``variable`` from a task's results (:func:`_on_block`)."""
    return results.flat[0][variable]


def _first_annotation(func: Callable[..., Any]) -> Any:
    """The annotation of ``func``'s first parameter (a string where it is postponed); None."""
    import inspect

    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return None
    return parameters[0].annotation


def _annotated(func: Callable[..., Any], *classes: type) -> bool:
    """Whether ``func``'s first parameter is annotated as one of ``classes`` (or names one)."""
    annotation = _first_annotation(func)
    if isinstance(annotation, str):
        return any(c.__name__ in annotation for c in classes)
    return isinstance(annotation, type) and issubclass(annotation, classes)


def takes_xarray(func: Callable[..., Any]) -> bool:
    """Whether ``func``'s first parameter is annotated as an xarray DataArray or Dataset."""
    return _annotated(func, xr.DataArray, xr.Dataset)


class XarrayFunctionOperator(Operator):
    """Wrap ``func(obj: xr.DataArray, **kwargs) -> xr.DataArray | xr.Dataset`` as an operator.

    Parameters
    ----------
    name
        Name to register it under.
    func
        A function of an xarray object, lazy on Dask data.
    whole
        Dims ``func`` needs whole (one chunk per task).
    free
        Instead of ``whole``: the dims the plan may cut; every other dim is whole.
    memory_model
        Peak bytes of one task from ``input_bytes``; left out, the operator measures itself
        on its first plan.
    description
        One line for :func:`xarray_memchunk.operator_names`.

    Examples
    --------
    >>> @operator(whole=["time"])                       # doctest: +SKIP
    ... def anomaly_p90(tas: xr.DataArray) -> xr.DataArray:
    ...     anomaly = tas.groupby("time.month") - tas.groupby("time.month").mean()
    ...     return anomaly.groupby("time.month").quantile(0.9)
    >>> ds.memchunk.apply(anomaly_p90)                  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        func: Callable[..., Any],
        *,
        whole: Sequence[str] = (),
        free: Sequence[str] | None = None,
        memory_model: LinearMemoryModel | None = None,
        description: str = "",
    ) -> None:
        if not callable(func):
            raise MemchunkError(f"operator {name!r} needs a function, got {func!r}")
        if free is not None and whole:
            raise MemchunkError(
                f"operator {name!r}: give the dims it needs whole (whole=...) or the dims the "
                f"plan may cut (free=...), not both"
            )
        if free is None and not whole:
            raise MemchunkError(
                f"operator {name!r}: say which dims the function needs whole, e.g. "
                f"whole=['time'] for a climatology over time, or which it leaves free, e.g. "
                f"free=['lat', 'lon']: every task sees the whole dims entire"
            )
        self.name = name
        self.func = func
        self.whole = tuple(map(str, whole))
        self.free = tuple(map(str, free)) if free is not None else None
        self.memory_model = memory_model
        self.description = description or f"user xarray operator {name!r}"
        identity = identify(func, self.whole, self.free)
        self.identity_known = identity.known
        self.identity_reason = identity.reason
        digest = identity.digest if identity.known else uuid.uuid4().hex
        self.calibration = f"{name}-{digest[:12]}"
        self._checked_free: set[tuple] = set()
        self._resolved: dict[tuple[str, ...], tuple[str, ...]] = {}  # see _named

    def __call__(self, obj: Any, **kwargs: Any) -> Any:
        """``func(obj, **kwargs)``, as xarray runs it: the decorated function still works."""
        return self.func(obj, **kwargs)

    def _named(self, da: xr.DataArray) -> tuple[str, ...]:
        """The dims ``whole=`` (or ``free=``) names, resolved in ``da``.

        A name may be a CF axis such as "T" or a coordinate's standard name, as the built-in
        operators' ``dim=``. Kept per dims: a measuring process's blocks carry the
        coordinates' values, not the attributes that name their axes.

        Raises
        ------
        DimensionError
            Naming those ``da`` lacks.
        """
        dims = tuple(map(str, da.dims))
        if dims in self._resolved:
            return self._resolved[dims]
        named = self.whole if self.free is None else self.free
        found, missing = [], []
        for key in named:
            try:
                found.append(resolve_dim(da, key))
            except DimensionError:
                missing.append(key)
        if missing:
            raise DimensionError(
                f"operator {self.name!r} needs dims {missing}, missing from dims {tuple(da.dims)}"
            )
        self._resolved[dims] = tuple(found)
        return self._resolved[dims]

    def _whole_dims(self, da: xr.DataArray) -> tuple[str, ...]:
        named = self._named(da)
        if self.free is None:
            return named
        return tuple(str(d) for d in da.dims if d not in named)

    def _free_dims(self, da: xr.DataArray) -> list[str]:
        """The dims plans may cut: every dim not whole."""
        return [str(d) for d in da.dims if d not in self._whole_dims(da)]

    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """The whole dims (given, or every dim but the free ones); each must exist in ``da``."""
        return {d: DimUse(DimRole.WHOLE) for d in self._whole_dims(da)}

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """The model given, or none: the function is measured on its first plan.

        One feature, the task's input bytes: the whole dims are the same in every task, so
        whatever ``func`` makes of them grows with the block. Calibrated under
        :attr:`calibration` and the keyword arguments' identity
        (:func:`~xarray_memchunk.operators.identity.calibration_key`), as NumPy functions are.
        """
        features = functools.partial(_input_features, itemsize=np.dtype(da.dtype).itemsize)
        key, doubt = calibration_key(self.calibration, self.func, kwargs, self.identity_reason)
        return Cost(key, features, self.memory_model, measurable=True, identity_doubt=doubt)

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the dims and build the result lazily once: a failing ``func`` fails here.

        Raises
        ------
        DimensionError
            When ``da`` lacks a dim the operator needs.
        MemchunkError
            When ``func`` raises on the lazy input or returns something other than a
            DataArray or a Dataset.
        """
        if da is not None:
            self.dims(da)
            self.template(da, kwargs)
            self._check_free_dims(da, kwargs)
        return dict(kwargs)

    def _check_free_dims(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> None:
        """Refuse a function whose values depend on neighbours along a dim plans may cut.

        On pieces of ``da`` with random values: :func:`~.halo_reach.check_free_dims`. Done
        once per dims, sizes and arguments.
        """
        free = self._free_dims(da)
        arguments = arguments_identity(self.func, kwargs)
        key = (np.dtype(da.dtype).str, tuple(da.sizes.items()), arguments.digest)
        if not free or key in self._checked_free or not checking():
            return
        check_free_dims(self.func, da, free, kwargs, self.name)
        if arguments.known:
            self._checked_free.add(key)

    def template(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> xr.DataArray | xr.Dataset:
        """``func`` on a sample of ones shaped as ``da``: whole dims entire, 2 of each free one.

        It gives the result's dims, coordinates and dtypes at once, with nothing read.

        Raises
        ------
        MemchunkError
            When ``func`` raises on the sample, returns something other than a DataArray or a
            Dataset, reduces over a dim the plan may cut or changes its length or labels.
        """
        return self._sampled(da, kwargs)[0]

    def _sampled(
        self, da: xr.DataArray, kwargs: Mapping[str, Any]
    ) -> tuple[xr.DataArray | xr.Dataset, xr.DataArray]:
        """:meth:`template`, and the sample it was made from."""
        free = self._free_dims(da)
        sample = piece_of(da, {d: min(2, da.sizes[d]) for d in free}, fill=1, spread=True)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.func(sample, **kwargs)
        except Exception as exc:
            hint = ""
            if _annotated(self.func, xr.Dataset) and not _annotated(self.func, xr.DataArray):
                hint = (
                    ". It is called once per variable, with that variable alone (a DataArray): "
                    "use the array it is given, and make the variables it reads beside it "
                    "coordinates first (ds.set_coords('sftlf'))"
                )
            raise MemchunkError(
                f"operator {self.name!r}: its function raised {type(exc).__name__} on a sample "
                f"of the input ({da.name or 'array'}, its whole dims entire): {exc}{hint}"
            ) from exc
        if not isinstance(out, xr.DataArray | xr.Dataset):
            raise MemchunkError(
                f"operator {self.name!r}: its function returned a {type(out).__name__}; it "
                f"must return an xarray DataArray or Dataset"
            )
        arrays = out.data_vars.values() if isinstance(out, xr.Dataset) else [out]
        for array in arrays:
            lost = [d for d in free if d not in array.dims]
            if lost:
                raise MemchunkError(
                    f"operator {self.name!r}: its function's result lacks {lost} (reduced over, "
                    f"or renamed), which the plan may cut (free dims: {free}): declare them "
                    f"whole"
                )
            for dim in free:
                changed = _changed_along(array, sample, dim)
                if changed:
                    raise MemchunkError(
                        f"operator {self.name!r}: its function {changed}, a dim the plan may "
                        f"cut: each task would do so to its own chunk alone. Declare {dim!r} "
                        f"whole (@xm.operator(whole=[..., {dim!r}]))"
                    )
        return out, sample

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> Any:
        """``func`` on each block, lazily: one call per planned chunk.

        Each task rebuilds its block as a DataArray with its coordinates and calls ``func``
        once; a block of a file's data is read by that task itself, so that no read task
        waits beside it (as for the other operators). Each output array is then taken from the
        task's result by a small task of its own. NumPy data is computed now, by ``func``.
        """
        import dask.array

        if da.chunks is None:
            return self.func(da, **kwargs)
        out, sample = self._sampled(da, kwargs)
        arrays = dict(out.data_vars) if isinstance(out, xr.Dataset) else {None: out}
        free = self._free_dims(da)
        # coordinates the function makes or changes along dims the plan may cut: taken from
        # each task too, along every free dim (the first element of those they lack kept)
        made = {
            name: out[name].reset_coords(drop=True)
            for name, coord in out.coords.items()
            if name not in out.indexes
            and set(coord.dims) & set(free)
            and not _same_coord(coord, sample.coords.get(name))
        }
        lacking = {name: [d for d in free if d not in c.dims] for name, c in made.items()}
        arrays |= {name: c.expand_dims(lacking[name]) for name, c in made.items()}
        orders = {
            name: (*free, *(str(d) for d in like.dims if d not in free))
            for name, like in arrays.items()
        }
        # every coordinate goes to the tasks (a Dask-backed one, 2-D lat/lon, computed here)
        coords = {
            str(k): (tuple(map(str, v.dims)), np.asarray(v.values)) for k, v in da.coords.items()
        }
        token = dask.base.tokenize(da.data.name, da.name, self.func, kwargs, coords)
        common = {
            **once_in_graph(
                {"function": self.func, "arguments": dict(kwargs), "coords": coords},
                f"{self.name}-{token}",
            ),
            "dims": tuple(map(str, da.dims)),
            "name_": da.name,
            "orders": orders,
            "free": tuple(free),
            "chunks": tuple((1,) * len(da.chunks[da.get_axis_num(d)]) for d in free),
            "dtype": object,
            "meta": np.empty((0,) * len(free), dtype=object),
            "name": f"{self.name}-{token}",
        }
        backend = file_backend(da.data)
        if backend is not None:  # each task reads its own block: no read task beside it
            pairs = zip(da.dims, da.chunks, strict=True)
            bounds = {str(d): tuple(np.cumsum((0, *c)).tolist()) for d, c in pairs}
            results = dask.array.map_blocks(_on_block, backend, bounds=bounds, **common)
        else:
            drop = [da.get_axis_num(d) for d in da.dims if d not in free]
            results = dask.array.map_blocks(_on_block, da.data, drop_axis=drop, **common)
        taken = {
            name: self._taken(da, results, like, name, free, orders[name], set(made))
            for name, like in arrays.items()
        }
        coords = {
            name: taken.pop(name).isel(dict.fromkeys(lacking[name], 0), drop=True) for name in made
        }
        if isinstance(out, xr.Dataset):
            return xr.Dataset(taken, coords=coords, attrs=out.attrs)
        return taken[None].assign_coords(coords)

    def _taken(
        self,
        da: xr.DataArray,
        results: Any,
        like: xr.DataArray,
        name: Any,
        free: Sequence[str],
        order: tuple[str, ...],
        made: set[Any],
    ) -> xr.DataArray:
        """Output ``name`` (``like``, from the template) taken from each task's results.

        Its coordinates along the free dims are the input's where the function kept them as
        they were (the template's are a sample's); those it ``made`` (or changed) are taken
        from the tasks apart, and those it dropped stay out.
        """
        other = order[len(free) :]
        chunks = [da.chunks[da.get_axis_num(d)] for d in free] + [(like.sizes[d],) for d in other]
        data = results.map_blocks(
            _take,
            name=f"{self.name}-{name}-{results.name}" if name is not None else None,
            variable=name,
            new_axis=list(range(len(free), len(order))) if other else None,
            chunks=tuple(chunks),
            dtype=like.dtype,
            meta=np.empty((0,) * len(order), dtype=like.dtype),
        )
        own = {k: v for k, v in like.coords.items() if not set(v.dims) & set(free)}
        own.update(
            {
                k: v
                for k, v in da.coords.items()
                if set(v.dims) <= set(free) and k in like.coords and k not in made
            }
        )
        result = xr.DataArray(data, dims=order, coords=own, attrs=like.attrs)
        result.name = like.name  # None stays None (not the Dask array's name)
        return result.transpose(*like.dims)

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """``func`` on each planned variable; a Dataset result's variables are prefixed by it.

        ``polyfit`` returns ``polyfit_coefficients``: on variable ``tas`` it becomes
        ``tas_polyfit_coefficients``. The variables not planned (a land mask without the
        whole dim ``time``, one the function fails on alone) are left out, with a warning that
        names them: xarray would compute them outside any plan (an anomaly broadcasts a
        static field along ``time``), and a run's report would count their tasks as the
        operator's. Whether and how xarray computes them is the user's (the function may drop
        them, or take DataArrays only): the warning gives no command.
        """
        results: dict[Any, Any] = {}
        for name in uses:
            out = self.compute(ds[name], uses[name], **kwargs)
            if isinstance(out, xr.Dataset):
                results.update({f"{name}_{v}": out[v] for v in out.data_vars})
            else:
                results[name] = out
        # a coordinate the function makes comes with each variable, lazily: the first planned
        # variable's is kept, unread (xarray would compute each to compare them)
        merged = xr.merge(
            [array.rename(name) for name, array in results.items()],
            compat="override",
            join="exact",
            combine_attrs="drop",
        )
        left = [name for name in ds.data_vars if str(name) not in uses]
        if left:
            names = ", ".join(map(repr, left))
            warn_at_caller(
                f"operator {self.name!r} leaves {names} out of the result: they lack the dims "
                f"it names, or its function fails on them alone (plan.notes say which). "
                f"Compute them with xarray, outside the plan, where you need them",
                UserWarning,
            )
        return merged.assign_attrs(ds.attrs)

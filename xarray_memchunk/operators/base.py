"""What an operator is: the dims it needs, its task memory model, and its lazy computation."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..models import LinearMemoryModel
from ..planning.problem import DimUse

__all__ = ["DimUse", "Operator", "float_dtype"]


def float_dtype(value: Any, what: str) -> np.dtype:
    """``value`` as a float dtype, or a :class:`MemchunkError` naming ``what`` was wrong."""
    from ..errors import MemchunkError

    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "f":
        raise MemchunkError(f"{what} must be a float dtype such as float32, got {value!r}")
    return dtype


class Operator(abc.ABC):
    """A lazy computation on xarray objects that knows how much memory one task needs.

    Subclass it (or use :class:`~xarray_memchunk.operators.blockwise.BlockwiseOperator`) and
    register it with :func:`xarray_memchunk.register_operator`; built-in operators use the same
    mechanism.

    Subclasses set :attr:`name` and implement :meth:`dim_uses`, :meth:`default_model` and
    :meth:`compute`; they override :meth:`task_features` when their memory depends on more than
    the task's input and output bytes.
    """

    #: Registered name, e.g. ``"gst3d"``.
    name: str = ""
    #: One line shown by :func:`xarray_memchunk.operators`.
    description: str = ""
    #: Default compute time per padded input element (used until calibrated).
    default_seconds_per_element: float = 1e-8
    #: Devices whose arrays :meth:`compute` accepts: ``"cpu"`` (NumPy), ``"gpu"`` (CuPy).
    devices: tuple[str, ...] = ("cpu",)

    def alternatives(self, kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, str]]:
        """Ways to run the operator, tried in order until one has a plan that fits.

        Returns ``(description, kwargs, reason)``: ``kwargs`` None marks a way that cannot be
        taken, and ``reason`` says why. One, the kwargs themselves, by default; SVD's
        ``method="auto"`` returns exact first, then compressed.
        """
        return [("", kwargs, "")]

    def bind(self, da: xr.DataArray, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Resolve arguments that name dims of ``da`` (e.g. CF axes) once, before planning."""
        return kwargs

    def reject_unknown(self, unknown: Iterable[str], accepted: Iterable[str] | None = None) -> None:
        """Raise :class:`MemchunkError` naming ``unknown`` arguments and the accepted ones.

        ``accepted`` defaults to the named parameters of :meth:`normalize_kwargs`.
        """
        unknown = sorted(unknown)
        if not unknown:
            return
        if accepted is None:
            parameters = inspect.signature(self.normalize_kwargs).parameters.values()
            accepted = [p.name for p in parameters if p.kind is not p.VAR_KEYWORD]
        from ..errors import MemchunkError

        raise MemchunkError(
            f"{self.name} got unexpected arguments {unknown}; it takes {', '.join(accepted)}"
        )

    def check_number(
        self, label: str, value: Any, *, integer: bool = False, minimum: float | None = 0.0
    ) -> float | int:
        """``value`` as a finite number (an int when ``integer``) of at least ``minimum``.

        Raises
        ------
        MemchunkError
            Naming the argument and what it got, whatever the wrong type or value.
        """
        from ..errors import MemchunkError

        kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
        if isinstance(value, bool) or not isinstance(value, kinds) or not np.isfinite(value):
            kind = "an int" if integer else "a number"
            raise MemchunkError(f"{self.name} {label} must be {kind}, got {value!r}")
        if minimum is not None and value < minimum:
            raise MemchunkError(f"{self.name} {label} must be at least {minimum:g}, got {value!r}")
        return int(value) if integer else float(value)

    def normalize_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """Check and complete the operator's keyword arguments, before anything runs.

        Raises
        ------
        MemchunkError
            On unknown or invalid arguments.
        """
        return kwargs

    @abc.abstractmethod
    def dim_uses(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Say how the operator uses the dims of ``da``; dims left out are free.

        Raises
        ------
        DimensionError
            When ``da`` lacks a dim the operator needs.
        """

    #: Kinds of dtype (``numpy.dtype.kind``) the operator computes on.
    dtype_kinds: str = "biufc"

    def rejects(self, da: xr.DataArray, **kwargs: Any) -> str | None:
        """Why the operator does not apply to this variable, or None when it does.

        A Dataset's variables that it does not apply to are left out of the plan (and, for
        the reductions, kept or dropped as xarray would); a DataArray raises with this reason.
        """
        from ..errors import DimensionError

        if da.dtype.kind not in self.dtype_kinds:
            return f"dtype {da.dtype} is not one {self.name} computes on"
        try:
            self.dim_uses(da, **kwargs)
        except DimensionError as exc:
            return str(exc)
        return None

    def passes(self, **kwargs: Any) -> int:
        """How many times the computation processes each input element; 1 by default.

        Calibration divides the measured time per element by this and planning multiplies
        it back, so one calibration serves every setting (the compressed SVD makes
        ``2 n_power_iter + 2`` passes over its input).
        """
        return 1

    def tasks_per_chunk(self, **kwargs: Any) -> float:
        """Dask tasks the computation creates per planned chunk, for the scheduling overhead.

        1 by default; the compressed SVD creates several per chunk and pass.
        """
        return 1.0

    def output_extents(
        self, extents: Mapping[str, np.ndarray], uses: Mapping[str, DimUse], **kwargs: Any
    ) -> dict[str, np.ndarray]:
        """Extents of one task's output from its (padded) input extents; same shape by default."""
        return dict(extents)

    def output_itemsize(self, itemsize: int, **kwargs: Any) -> int:
        """Bytes per output element; the input's by default."""
        return itemsize

    def task_features(
        self,
        extents: Mapping[str, np.ndarray],
        uses: Mapping[str, DimUse],
        itemsize: int,
        sizes: Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Features of one task for the memory model.

        Parameters
        ----------
        extents
            Padded input extents of one task per dim (arrays: one entry per candidate).
        uses
            How the operator uses each dim.
        itemsize
            Bytes per input element.
        sizes
            Full length of each dim of the array (the extents of a single-chunk array when
            None), for operators whose tasks depend on the number of chunks.

        Returns
        -------
        dict
            ``input_bytes`` (padded input) and ``output_bytes`` (one task's output).
        """
        names = list(extents)
        input_elements = np.prod([np.asarray(extents[n], dtype=np.float64) for n in names], axis=0)
        out = self.output_extents(extents, uses, **kwargs)
        output_elements = np.prod([np.asarray(v, dtype=np.float64) for v in out.values()], axis=0)
        return {
            "input_bytes": input_elements * itemsize,
            "output_bytes": output_elements * self.output_itemsize(itemsize, **kwargs),
        }

    @abc.abstractmethod
    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """Analytic memory model, used when no calibration exists for this input dtype."""

    def calibration_shapes(self, **kwargs: Any) -> list[dict[str, int]]:
        """Padded task extents that :func:`xarray_memchunk.calibrate` profiles by default.

        ``kwargs`` are the operator's (normalized) arguments, for operators whose variants
        are calibrated on different shapes.

        Raises
        ------
        MemchunkError
            Unless overridden: a custom operator's calibration needs ``shapes=``.
        """
        from ..errors import MemchunkError

        raise MemchunkError(
            f"operator {self.name!r} has no default calibration shapes: pass shapes=[{{dim: "
            f"length, ...}}, ...] to calibrate()"
        )

    def calibration_kwargs(self) -> dict[str, Any]:
        """Operator arguments used when calibrating (e.g. which dim a reduction reduces)."""
        return {}

    def calibration_key(self, **kwargs: Any) -> str:
        """Name of the calibration file for these arguments (operator variants may differ)."""
        return self.name

    @abc.abstractmethod
    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply the operator lazily to ``da``, already chunked as planned (or numpy-backed)."""

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """Apply the operator to each planned variable of ``ds``; the others are left out."""
        return xr.Dataset(
            {name: self.compute(ds[name], uses[name], **kwargs) for name in uses},
            attrs=ds.attrs,
        )

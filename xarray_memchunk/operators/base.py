"""What an operator is: the dims it needs, its task memory model, and its lazy computation."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from ..models import LinearMemoryModel, load_calibration
from ..planning.problem import DimRole

__all__ = ["DimUse", "Operator", "TaskModel"]


@dataclass(frozen=True)
class DimUse:
    """How an operator uses one dim: its :class:`DimRole` and, for halo dims, the depth."""

    role: DimRole = DimRole.FREE
    depth: int = 0


@dataclass(frozen=True)
class TaskModel:
    """The memory model an operator uses for one dtype and device, and where it came from."""

    model: LinearMemoryModel
    seconds_per_element: float
    source: str


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

    def alternatives(self, kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Ways to run the operator, tried in order until one has a plan that fits.

        Returns ``(description, kwargs)`` pairs; one, the kwargs themselves, by default.
        SVD's ``method="auto"`` returns exact first, then compressed.
        """
        return [("", kwargs)]

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

    def accepts(self, da: xr.DataArray, **kwargs: Any) -> bool:
        """Whether the operator applies to this variable of a Dataset."""
        from ..errors import DimensionError

        try:
            self.dim_uses(da, **kwargs)
        except DimensionError:
            return False
        return True

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

    def task_model(self, array_dtype: np.dtype, device: str = "cpu", **kwargs: Any) -> TaskModel:
        """The calibrated model for this input dtype and device if there is one, else analytic."""
        dtype_name = np.dtype(array_dtype).name
        calibration = load_calibration(self.calibration_key(**kwargs), device, dtype_name)
        if calibration is not None:
            return TaskModel(calibration.model, calibration.seconds_per_element, calibration.path)
        return TaskModel(
            self.default_model(np.dtype(array_dtype), **kwargs),
            self.default_seconds_per_element,
            "analytic (not calibrated)",
        )

    def peak_bytes(
        self,
        extents: Mapping[str, np.ndarray],
        uses: Mapping[str, DimUse],
        array_dtype: np.dtype,
        device: str = "cpu",
        sizes: Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Predicted peak bytes of one task with these padded input extents."""
        itemsize = np.dtype(array_dtype).itemsize
        features = self.task_features(extents, uses, itemsize, sizes=sizes, **kwargs)
        return self.task_model(array_dtype, device, **kwargs).model.peak_bytes(features)

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

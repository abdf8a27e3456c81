"""What an operator is: the dims it needs, its task memory model, and its lazy computation.

A user's operator writes four things: :meth:`~Operator.dim_uses` (which dims it needs whole,
with a halo, or free), :meth:`~Operator.default_model` (its memory model until calibrated),
:meth:`~Operator.compute` (the lazy computation) and, when its memory depends on more than its
input and output bytes, :meth:`~Operator.task_features`. The rest has defaults. Planning never
asks an operator directly: :func:`~xarray_memchunk.operators.cost.resolve_cost` resolves each
variable once into a :class:`~xarray_memchunk.operators.cost.TaskCost`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ..models import LinearMemoryModel
from ..planning.problem import DimUse

__all__ = ["CostTerms", "DimUse", "Operator"]


@dataclass(frozen=True)
class CostTerms:
    """What an operator's arguments change about its cost, besides the task's shape.

    Attributes
    ----------
    calibration
        Name of the calibration file (variants of an operator are calibrated apart).
    passes
        Times the computation processes each input element: calibration divides the measured
        time per element by it and planning multiplies it back (the compressed SVD makes
        ``2 n_power_iter + 2`` passes).
    tasks_per_chunk
        Dask tasks the computation creates per planned chunk (scheduling overhead).
    held_share
        Share of the whole array a worker holds beside its running task, its part of
        intermediate results that wait for a later step (tsqr's first Q factors wait for the
        QR of the stacked R factors): ``held_share x array bytes / workers``.
    held_per_chunk
        Bytes held for each planned chunk until a later step, whatever the chunk's size (the
        two-pass tsqr's ``n x n`` factors): ``held_per_chunk x chunks`` on one worker, where
        the tree that holds them ends.
    """

    calibration: str
    passes: int = 1
    tasks_per_chunk: float = 1.0
    held_share: float = 0.0
    held_per_chunk: float = 0.0


class Operator(abc.ABC):
    """A lazy computation on xarray objects that knows how much memory one task needs.

    Subclass it (or use :class:`~xarray_memchunk.operators.blockwise.BlockwiseOperator`) and
    register it with :func:`xarray_memchunk.register_operator`; built-in operators use the same
    mechanism. See the module docstring for what a subclass writes.

    The halo rule: a dim the operator uses with a halo (a :class:`DimUse` of role ``HALO``
    with a ``depth``) of a variable read straight from a file is planned assuming that each
    task reads its own block, halo included, from the file, and that no worker holds chunks
    for other tasks. :meth:`compute` must therefore read halos with
    :func:`~xarray_memchunk.operators.sources.map_blocks_with_halo` (as the built-in operators
    and ``BlockwiseOperator(depth=...)`` do), which does so for file data and falls back to
    ``map_overlap`` for any other. Gathering the halos inside the graph instead, with
    ``dask.array.map_overlap``, ``dask.array.overlap`` or xarray's ``.rolling()``, makes the
    workers hold neighbour chunks the plan never counted (35-58% of the whole array on one
    worker, measured), and the plan would be too small. ``apply`` checks the rule on the lazy
    result before anything runs and raises a :class:`~xarray_memchunk.MemchunkError` where it
    is broken (:func:`~xarray_memchunk.operators.halo_rule.check_halo_reads`).
    """

    #: Registered name, e.g. ``"gst3d"``.
    name: str = ""
    #: One line shown by :func:`xarray_memchunk.operator_names` and ``memchunk operators``.
    description: str = ""
    #: Default compute time per padded input element (used until calibrated).
    default_seconds_per_element: float = 1e-8
    #: Devices whose arrays :meth:`compute` accepts: ``"cpu"`` (NumPy), ``"gpu"`` (CuPy).
    devices: tuple[str, ...] = ("cpu",)
    #: Kinds of dtype (``numpy.dtype.kind``) the operator computes on.
    dtype_kinds: str = "biufc"
    #: Operator arguments used when calibrating (e.g. which dim a reduction reduces).
    calibration_kwargs: ClassVar[Mapping[str, Any]] = {}

    @abc.abstractmethod
    def dim_uses(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Say how the operator uses the dims of ``da``; dims left out are free.

        Raises
        ------
        DimensionError
            When ``da`` lacks a dim the operator needs.
        """

    @abc.abstractmethod
    def default_model(self, array_dtype: np.dtype, **kwargs: Any) -> LinearMemoryModel:
        """Analytic memory model, used when no calibration exists for this input dtype."""

    @abc.abstractmethod
    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply the operator lazily to ``da``, already chunked as planned (or numpy-backed)."""

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
            ``input_bytes`` (padded input) and ``output_bytes`` (one task's output, the
            input's shape).
        """
        elements = np.prod([np.asarray(v, dtype=np.float64) for v in extents.values()], axis=0)
        return {
            "input_bytes": elements * itemsize,
            "output_bytes": elements * self.output_itemsize(itemsize, **kwargs),
        }

    def output_itemsize(self, itemsize: int, **kwargs: Any) -> int:
        """Bytes per output element; the input's by default."""
        return itemsize

    def normalize_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """Check and complete the operator's keyword arguments, before anything runs.

        Raises
        ------
        MemchunkError
            On unknown or invalid arguments.
        """
        return kwargs

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

    def cost_terms(self, **kwargs: Any) -> CostTerms:
        """What the operator's arguments change about its cost (see :class:`CostTerms`).

        Takes the operator's arguments and, when planning a variable, its ``array_sizes``,
        ``array_dtype`` and ``array_device`` (``"cpu"`` or ``"gpu"``), for terms that depend on
        them, such as ``held_per_chunk``.
        """
        return CostTerms(self.name)

    def calibration_shapes(self, **kwargs: Any) -> list:
        """Task shapes that :func:`xarray_memchunk.calibrate` profiles by default.

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

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """What becomes of a Dataset's variable the operator does not apply to, and why.

        ``reason`` is the error :func:`~xarray_memchunk.operators.cost.resolve_cost` raised for
        it. Left out of the result by default; the reductions keep some, as xarray does.
        """
        return f"{reason}: left out of the result"

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """Apply the operator to each planned variable of ``ds``; the others are left out."""
        return xr.Dataset(
            {name: self.compute(ds[name], uses[name], **kwargs) for name in uses},
            attrs=ds.attrs,
        )

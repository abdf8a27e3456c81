"""What every SVD algorithm states: when it is tried, what it costs, and how it computes.

The :class:`~xarray_memchunk.operators.svd.operator.SVD` operator stacks a DataArray to a
matrix, ``sample`` (rows) by ``feature`` (columns), and leaves all that depends on the
algorithm to an :class:`SVDAlgorithm`. Each algorithm states it once, in its own module: the
dims it chunks, the features of one task's memory, its cost (:meth:`SVDAlgorithm.cost`: the
operator's :class:`~xarray_memchunk.operators.base.Cost`, with its calibration key, default
memory model, passes, tasks per chunk and memory held beside the tasks), the task shapes
calibration profiles, and the decomposition itself.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ...models import LinearMemoryModel
from ..base import Cost, DimUse

__all__ = [
    "DEFAULT_INTERCEPT",
    "DEFAULT_SECONDS_PER_ELEMENT",
    "Alternative",
    "SVDAlgorithm",
    "matrix_shape",
    "split_names",
]

#: Fixed bytes per task of every default (analytic) memory model.
DEFAULT_INTERCEPT = 16 * 2**20
#: Compute time per element and pass of every algorithm, until calibrated.
DEFAULT_SECONDS_PER_ELEMENT = 2e-8

#: One way to run the operator: ``(description, kwargs or None, why it cannot be taken)``, as
#: :meth:`~xarray_memchunk.operators.base.Operator.alternatives` returns them.
Alternative = tuple[str, dict[str, Any] | None, str]


class SVDAlgorithm(abc.ABC):
    """One algorithm of the SVD operator: its costs and its computation.

    Subclasses state the class attributes below and implement the abstract methods; the
    operator keeps one instance of each in its table of algorithms.
    """

    #: Key of the operator's table: the ``tsqr=`` value (exact SVD) or the ``method=`` value
    #: (compressed SVD) that names the algorithm.
    name: ClassVar[str]
    #: The ``method=`` the algorithm computes: ``"exact"`` or ``"compressed"``.
    method: ClassVar[str]
    #: The ``(method, tsqr)`` arguments under which the operator tries the algorithm.
    selected_by: ClassVar[frozenset[tuple[str, str]]]
    #: Whether the algorithm needs ``k=`` (the number of components).
    needs_k: ClassVar[bool] = False
    #: Key of its calibration files (``models/calibrations/<key>-<device>.json``).
    calibration: ClassVar[str]
    #: Bytes per unit of each of its features (:meth:`block_features`) until calibrated.
    default_coefficients: ClassVar[Mapping[str, float]]
    #: ``(time, space)`` sizes of the single-block tasks that calibration profiles.
    calibration_sizes: ClassVar[tuple[tuple[int, int], ...]]

    def selected(self, method: str, tsqr: str) -> bool:
        """Whether ``method=`` and ``tsqr=`` let the operator try this algorithm."""
        return (method, tsqr) in self.selected_by

    @abc.abstractmethod
    def alternative(self, kwargs: dict[str, Any]) -> Alternative:
        """The algorithm as one of the operator's alternatives, for the arguments ``kwargs``."""

    @abc.abstractmethod
    def chunked_dims(
        self, sizes: Mapping[str, int], samples: Sequence[str], features: Sequence[str]
    ) -> dict[str, DimUse]:
        """The dims the algorithm lets the planner chunk; every other dim stays whole.

        Parameters
        ----------
        sizes
            Length of each dim of the DataArray.
        samples, features
            The dims stacked into rows and into columns.
        """

    @abc.abstractmethod
    def block_features(
        self, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], itemsize: int
    ) -> dict[str, np.ndarray]:
        """Features of one task for the memory model.

        Parameters
        ----------
        rows, cols
            Rows and columns of one block of the stacked matrix (one entry per candidate).
        shape
            ``(rows, columns)`` of the whole stacked matrix.
        itemsize
            Bytes per input element.
        """

    @abc.abstractmethod
    def cost(self, da: xr.DataArray, kwargs: Mapping[str, Any]) -> Cost:
        """The algorithm's cost on ``da`` for the operator's arguments ``kwargs``.

        Each algorithm states its terms (passes, tasks per chunk, memory held) and takes the
        rest from :meth:`matrix_cost`.
        """

    @abc.abstractmethod
    def decompose(self, data: Any, xp: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """Thin SVD ``(U, S, V^H)`` of the stacked matrix ``data``.

        Parameters
        ----------
        data
            The stacked matrix: a Dask array (lazy) or an in-memory NumPy or CuPy one.
        xp
            The array module of its blocks (NumPy or CuPy).
        kwargs
            The operator's arguments.
        """

    def matrix_cost(
        self,
        da: xr.DataArray,
        kwargs: Mapping[str, Any],
        *,
        passes: int = 1,
        tasks_per_chunk: float = 1.0,
        held_share: float = 0.0,
        factors_bytes_per_chunk: float = 0.0,
        work_per_element: Callable[[Mapping[str, int]], float] | None = None,
        combine_elements_per_chunk: float = 0.0,
    ) -> Cost:
        """The algorithm's :class:`~xarray_memchunk.operators.base.Cost` on ``da``, these terms.

        Its :meth:`block_features` of the blocks of ``da`` stacked to a matrix (``sample_dims``
        rows), its :attr:`default_coefficients` and :data:`DEFAULT_INTERCEPT` as the analytic
        model, and its :attr:`calibration` key.
        """
        sample_dims = kwargs.get("sample_dims")
        shape = matrix_shape({str(d): int(n) for d, n in da.sizes.items()}, sample_dims)
        itemsize = np.dtype(da.dtype).itemsize

        def features(extents: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            samples, columns = split_names(extents, sample_dims)
            rows = np.prod([np.asarray(extents[d], float) for d in samples], axis=0)
            cols = np.prod([np.asarray(extents[d], float) for d in columns], axis=0)
            return self.block_features(rows, cols, shape, itemsize)

        return Cost(
            self.calibration,
            features,
            LinearMemoryModel(dict(self.default_coefficients), intercept=DEFAULT_INTERCEPT),
            seconds_per_element=DEFAULT_SECONDS_PER_ELEMENT,
            passes=passes,
            tasks_per_chunk=tasks_per_chunk,
            held_share=held_share,
            factors_bytes_per_chunk=factors_bytes_per_chunk,
            work_per_element=work_per_element,
            combine_elements_per_chunk=combine_elements_per_chunk,
        )

    def calibration_shapes(self) -> list[dict[str, int]]:
        """Task shapes to profile: :attr:`calibration_sizes` as ``time`` by ``space``."""
        return [{"time": t, "space": s} for t, s in self.calibration_sizes]


def split_names(
    names: Mapping[str, Any], sample_dims: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The dims of ``names`` stacked into rows (``sample_dims``) and those into columns."""
    samples = [d for d in names if sample_dims and d in sample_dims]
    features = [d for d in names if d not in samples]
    return samples, features


def matrix_shape(sizes: Mapping[str, int], sample_dims: Sequence[str] | None) -> tuple[int, int]:
    """``(rows, columns)`` of the stacked matrix: the sample dims' sizes, then every other dim's."""
    samples, features = split_names(sizes, sample_dims)
    return math.prod(sizes[d] for d in samples), math.prod(sizes[d] for d in features)

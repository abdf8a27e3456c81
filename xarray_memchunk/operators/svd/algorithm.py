"""What every SVD algorithm states: when it is tried, what it costs, and how it computes.

The :class:`~xarray_memchunk.operators.svd.operator.SVD` operator stacks a DataArray to a
matrix, ``sample`` (rows) by ``feature`` (columns), and leaves all that depends on the
algorithm to an :class:`SVDAlgorithm`. Each algorithm states it once, in its own module: the
dims it chunks, the features of one task's memory, its default memory model, its cost terms
(calibration key, passes, tasks per chunk, memory held beside the tasks), the task shapes
calibration profiles, and the decomposition itself.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ...models import LinearMemoryModel
from ..base import CostTerms, DimUse

__all__ = ["DEFAULT_INTERCEPT", "Alternative", "SVDAlgorithm", "matrix_shape", "split_names"]

#: Fixed bytes per task of every default (analytic) memory model.
DEFAULT_INTERCEPT = 16 * 2**20

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
    #: Bytes per unit of each of its features (:meth:`task_features`) until calibrated.
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
    def task_features(
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
    def cost_terms(self, kwargs: Mapping[str, Any]) -> CostTerms:
        """The algorithm's cost terms for the operator's arguments.

        ``kwargs`` are the operator's arguments and, when planning a variable, its
        ``array_sizes``, ``array_dtype`` and ``array_device``.
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

    def default_model(self) -> LinearMemoryModel:
        """Analytic memory model: :attr:`default_coefficients` and a fixed intercept."""
        return LinearMemoryModel(dict(self.default_coefficients), intercept=DEFAULT_INTERCEPT)

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

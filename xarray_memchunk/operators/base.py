"""What an operator is: the dims it needs, its whole memory story, and its lazy computation.

A subclass of :class:`Operator` writes three things:

- :meth:`~Operator.dims`: which dims of a variable it needs whole, with a halo, or free;
- :meth:`~Operator.cost`: its memory story on a variable, in one statement, a :class:`Cost`:
  the calibration key, the features of one task, the analytic model until calibrated, and
  what its arguments change about the cost besides a task's shape;
- :meth:`~Operator.compute`: the lazy computation.

The other methods are hooks with defaults, overridden only where an operator family differs
(each says why in its docstring). Planning never asks an operator directly:
:func:`~xarray_memchunk.operators.cost.resolve_cost` resolves each variable once into a
:class:`~xarray_memchunk.operators.cost.TaskCost`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from ..models import LinearMemoryModel
from ..planning.problem import DimUse

__all__ = ["Cost", "DimUse", "Features", "Operator", "input_output_features", "padded_elements"]

#: Features of one task from its padded extents per dim (arrays: one entry per candidate).
Features = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def padded_elements(padded: Mapping[str, np.ndarray]) -> np.ndarray:
    """Elements of one task per candidate: the product of its padded extents over the dims."""
    return np.prod([np.asarray(v, dtype=np.float64) for v in padded.values()], axis=0)


def input_output_features(itemsize: int, output_itemsize: int | None = None) -> Features:
    """The features of a task whose output has its input's shape.

    Parameters
    ----------
    itemsize
        Bytes per input element.
    output_itemsize
        Bytes per output element; the input's when None.

    Returns
    -------
    Features
        ``input_bytes`` (the padded input) and ``output_bytes`` (one task's output, the padded
        input's shape) of padded extents.
    """
    out_itemsize = itemsize if output_itemsize is None else output_itemsize

    def features(padded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        elements = padded_elements(padded)
        return {"input_bytes": elements * itemsize, "output_bytes": elements * out_itemsize}

    return features


@dataclass(frozen=True)
class Cost:
    """An operator's whole memory story on one variable, for its arguments.

    Attributes
    ----------
    calibration_key
        Name of the operator's calibration files (``<key>-<device>.json``) and of what runs
        teach about it: variants of an operator (``gst3d-d2geo``, ``svd-two-pass``) are
        calibrated apart.
    features
        Features of one task from its padded extents per dim, bound to the variable (its
        itemsize, sizes, how the operator uses each dim, the output's itemsize).
    model
        Analytic memory model over ``features``, used until calibrated; None where there is
        none (a NumPy function measured on its first plan).
    seconds_per_element
        Compute time per padded input element and pass, used until calibrated.
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
    factors_bytes_per_chunk
        Bytes held for each planned chunk until a later step, whatever the chunk's size (the
        two-pass tsqr's ``n x n`` factors): ``factors_bytes_per_chunk x chunks`` on one worker,
        where the tree that holds them ends (the plan's ``factors_bytes``).
    measurable
        Whether planning may measure the operator on blocks of the data (a NumPy function):
        where ``model`` is None and no calibration is saved, or where runs found its model
        wrong.
    identity_doubt
        Why a calibration saved under ``calibration_key`` may be another operator's (a value
        its function depends on cannot be hashed stably); empty where there is no doubt. A
        measurable operator in doubt is measured again rather than planned with it.
    fuses_with_input
        Whether the operator's first step on a block fuses with the element-wise steps that
        produce its input (Dask's blockwise fusion of ``map_blocks``, ``map_overlap`` on one
        chunk, a reduction's chunk function): the fused task then holds the graph's inputs to
        those steps (a float64 block cast to float32) until it ends, and the plan counts them
        beside the operator's own peak. False where the first step is a task of its own
        (``median`` and ``quantile``: ``nanmedian`` runs after the input's steps end). True,
        the safer of the two, by default.
    runtime_bytes
        Memory a worker keeps once it has run the operator's first task, whatever the task's
        size and however many threads it runs (compiled code: the fused GST3D kernel loads
        Numba's runtime, 122 MB measured in a ``LocalCluster`` worker). Planned once per
        worker, shared among its task slots.
    work_per_element
        A function of an array's sizes (dim -> length) that gives the operator's relative
        compute per element on it, where that depends on the array (a QR's flops per element
        grow with the matrix's shorter side); None where it does not. A CPU calibration
        records the work its tasks were timed at, and a plan scales the calibrated time per
        element by its array's work over theirs.
    combine_elements_per_chunk
        Elements of combining work each planned chunk adds after its own task, at the
        operator's time per element and pass, once (tsqr's stacked ``R`` factors: ``n x n``
        per block): a plan of more, smaller chunks pays for a larger tree.
    """

    calibration_key: str
    features: Features
    model: LinearMemoryModel | None
    seconds_per_element: float = 1e-8
    passes: int = 1
    tasks_per_chunk: float = 1.0
    held_share: float = 0.0
    factors_bytes_per_chunk: float = 0.0
    measurable: bool = False
    identity_doubt: str = ""
    fuses_with_input: bool = True
    runtime_bytes: float = 0.0
    work_per_element: Callable[[Mapping[str, int]], float] | None = None
    combine_elements_per_chunk: float = 0.0


class Operator(abc.ABC):
    """A lazy computation on xarray objects that knows how much memory one task needs.

    Subclass it (or use :class:`~xarray_memchunk.operators.blockwise.BlockwiseOperator`) and
    register it with :func:`xarray_memchunk.register_operator`; built-in operators use the same
    mechanism. A subclass writes :meth:`dims`, :meth:`cost` and :meth:`compute`; the other
    methods are hooks with defaults.

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

    Examples
    --------
    A 5-point uniform filter along ``x`` (``docs/user-guide/operators.md`` runs it):

    >>> class Smooth(Operator):
    ...     name = "smooth"
    ...
    ...     def dims(self, da, **kwargs):
    ...         return {"x": DimUse(DimRole.HALO, 2)}
    ...
    ...     def cost(self, da, **kwargs):
    ...         model = LinearMemoryModel({"input_bytes": 2.0, "output_bytes": 1.0})
    ...         return Cost(self.name, input_output_features(da.dtype.itemsize), model)
    ...
    ...     def compute(self, da, uses, **kwargs):
    ...         axis = da.get_axis_num("x")
    ...         data = map_blocks_with_halo(
    ...             da.data, uniform_filter1d, {axis: uses["x"].depth}, da.dtype, size=5, axis=axis
    ...         )
    ...         return da.copy(data=data)
    """

    #: Registered name, e.g. ``"gst3d"``.
    name: str = ""
    #: One line shown by :func:`xarray_memchunk.operator_names` and ``memchunk operators``.
    description: str = ""
    #: Devices whose arrays :meth:`compute` accepts: ``"cpu"`` (NumPy), ``"gpu"`` (CuPy).
    devices: tuple[str, ...] = ("cpu",)
    #: Kinds of dtype (``numpy.dtype.kind``) the operator computes on.
    dtype_kinds: str = "biufc"
    #: Built-in operators: the argument sets calibrated apart, one shipped calibration file
    #: each, under the key :meth:`cost` names for them (``benchmarks/calibrate_shipped.py``
    #: reads it). The default arguments alone by default.
    shipped_calibrations: tuple[Mapping[str, Any], ...] = ({},)
    #: Whether every one of :meth:`alternatives` is planned and the fastest that fits taken
    #: (a groupby's flox methods), rather than the first that fits (SVD: exact before
    #: compressed).
    chooses_fastest: bool = False
    #: Whether :meth:`compute_dataset` keeps variables it does not apply to, computed by xarray
    #: (a groupby broadcasts them along its groups): their tasks are then sized at plan time
    #: (:mod:`~xarray_memchunk.operators.kept_variables`). Where False, it leaves them out.
    keeps_unplanned_variables: bool = False

    @abc.abstractmethod
    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """Say how the operator uses the dims of ``da``; dims left out are free.

        Raises
        ------
        DimensionError
            When ``da`` lacks a dim the operator needs.
        """

    @abc.abstractmethod
    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """The operator's memory story on ``da`` with the arguments ``kwargs``, in one statement.

        Raises
        ------
        DimensionError
            When ``da`` lacks a dim the operator needs.
        """

    @abc.abstractmethod
    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Apply the operator lazily to ``da``, already chunked as planned (or numpy-backed)."""

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the operator's keyword arguments; return them completed.

        Hook: operators with arguments check them. Called first without ``da``, before
        anything runs (check and complete the arguments: defaults filled in, unknown ones
        refused), then once per planned variable with the arguments it returned and the
        variable (resolve arguments that name dims of ``da``, e.g. CF axes, and check them
        against its data). Returns ``kwargs`` unchanged by default.

        Raises
        ------
        MemchunkError
            On unknown or invalid arguments (for ``da``: the variable is left out of a
            Dataset's result, :meth:`skipped`).
        """
        return dict(kwargs)

    def alternatives(self, kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, str]]:
        """Ways to run the operator, tried in order until one has a plan that fits.

        Hook: for an operator that chooses among algorithms by the budget (SVD's
        ``method="auto"`` returns exact first, then compressed). Returns ``(description,
        kwargs, reason)``: ``kwargs`` None marks a way that cannot be taken, and ``reason``
        says why. One, the kwargs themselves, by default.
        """
        return [("", kwargs, "")]

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list]:
        """The arguments and the task shapes :func:`xarray_memchunk.calibrate` profiles.

        Hook: for an operator whose calibration shapes and arguments are known in advance
        (which dim a reduction reduces, shapes of its dims). ``kwargs`` over the operator's
        calibration defaults, checked (:meth:`check_arguments`), and the task shapes to
        profile when ``calibrate`` is given none: ``(extents, sizes)`` pairs for tasks of a
        larger array, or extents alone. None by default: ``calibrate`` then needs
        ``shapes=``.
        """
        return self.check_arguments(kwargs), []

    def tree_shapes(
        self, extents: Mapping[str, int], **kwargs: Any
    ) -> list[tuple[dict[str, int], dict[str, int]]]:
        """Tasks of several chunks to measure when the operator calibrates itself.

        Hook: for an operator that combines partial results of its chunks in a tree (a
        groupby's map-reduce), whose combine tasks one-chunk blocks never run. Given the
        largest block measured, ``(chunk extents, array sizes)`` pairs: the graph of each
        array's middle output block is measured whole. None by default.
        """
        return []

    def runtime_loaded(self) -> bool:
        """Whether this process holds the operator's runtime already (its compiled code).

        Hook: for an operator whose cost states :attr:`Cost.runtime_bytes`. With no cluster,
        the tasks run in this process, whose memory now is the budget's baseline: a runtime
        loaded here is in it, and a plan does not count it again. False by default.
        """
        return False

    def kept_unplanned(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> list[str]:
        """The variables of ``ds`` not in ``uses`` that :meth:`compute_dataset` keeps.

        All of them where :attr:`keeps_unplanned_variables`, else none. An operator that
        leaves some out says which it keeps (a groupby leaves out dates too large to reduce
        beside the plan), so that nothing is sized for a variable the result drops.
        """
        if not self.keeps_unplanned_variables:
            return []
        return [str(name) for name in ds.data_vars if str(name) not in uses]

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """What becomes of a Dataset's variable the operator does not apply to, and why.

        Hook: for an operator that keeps such variables (the reductions keep unreduced ones,
        as xarray does). ``reason`` is the error raised for the variable. Left out of the
        result by default.
        """
        return f"{reason}: left out of the result"

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """Apply the operator to each planned variable of ``ds``; the others are left out.

        Hook: for an operator whose Dataset result is not one variable per planned variable
        (the reductions keep unreduced variables, SVD decomposes one variable, GST3D names its
        outputs after the attribute).
        """
        return xr.Dataset(
            {name: self.compute(ds[name], uses[name], **kwargs) for name in uses},
            attrs=ds.attrs,
        )

"""Group-by reductions (``groupby``): a climatology, with flox's method chosen with the chunks.

``da.memchunk.apply("groupby", by="time.month")`` equals ``da.groupby("time.month").mean()``,
computed by flox, the library xarray groups with. flox runs a grouped reduction of chunked
data in one of two ways that matter for memory, and the plan prices both and takes the faster
that fits (``explain()`` says which, and why not the other):

- ``"map-reduce"`` (reductions with partial results: ``sum``, ``mean``, ``std``, ``var``,
  ``min``, ``max``, ``count``, ``prod``): the grouped dim is cut into chunks, read as stored.
  Each task reduces its chunk to partial results for *every* group of the data (flox reindexes
  them to all groups), and combine tasks concatenate ``split_every`` (4) of them. The partial
  results grow with the number of groups, not with the chunk: 12 per location for a monthly
  climatology, 366 for a day-of-year one, so a short chunk can hold far more partials than
  data (flox#346, dask#11026). Where a combine task's partials per location are at least the
  whole dim's data (a day-of-year climatology of four years), map-reduce cannot need less
  than blockwise and is not planned (:func:`partials_outweigh_data`).
- ``"blockwise"`` (any reduction, ``median`` too): the grouped dim whole in every task, so that
  each group is complete in its task and nothing waits between tasks; the other dims are cut.

The memory of each way is measured on its first plan for each grouping and reduction (as for
a NumPy function), the map-reduce way on single chunks and on trees of chunks, so that its
combine tasks are measured too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from ..errors import InfeasiblePlanError, MemchunkError
from ..planning.problem import DimRole
from .arguments import reject_unknown
from .base import Cost, DimUse, Operator, padded_elements
from .grouping import (
    flox_enabled,
    grouped_variables,
    kept_by_grouping,
    not_calibrated_apart,
    note_unplanned,
    uses_flox,
)
from .reductions import split_every, tree_shape

__all__ = [
    "METHODS",
    "PARTIAL_BYTES",
    "REDUCTIONS",
    "Groupby",
    "group_starts",
    "partials_outweigh_data",
]

#: Bytes per group and location of a map-reduce task's partial results, per reduction (0: the
#: input's itemsize): a float64 sum, a count and a sum for mean, three moments for std and var.
PARTIAL_BYTES = {
    "sum": 8,
    "mean": 16,
    "std": 24,
    "var": 24,
    "min": 0,
    "max": 0,
    "count": 8,
    "prod": 8,
}
#: The reductions a groupby may take: those with partial results, and the median (blockwise).
REDUCTIONS = (*PARTIAL_BYTES, "median")
#: flox's methods the plan chooses from.
METHODS = ("map-reduce", "blockwise")
#: Chunks per tree that self-calibration measures besides single chunks (map-reduce).
_TREE_CHUNKS = (8, 32)


def group_starts(da: xr.DataArray, by: str) -> tuple[str, tuple[int, ...]]:
    """The grouped dim, and the step along it at which each group first appears (increasing).

    ``len(starts)`` is the number of groups; ``sum(s < n for s in starts)`` the number of groups
    in the first ``n`` steps.

    Raises
    ------
    MemchunkError
        When ``by`` is not a 1-D coordinate (or a virtual one, ``"time.month"``) of ``da``.
    """
    try:
        group = da[by]
    except (KeyError, AttributeError, ValueError) as exc:
        raise MemchunkError(
            f"groupby by={by!r} is not a coordinate of the data (nor a part of one, as "
            f"'time.month'): it has {', '.join(map(str, da.coords)) or 'none'}"
        ) from exc
    if group.ndim != 1:
        raise MemchunkError(f"groupby by={by!r} must be one-dimensional, it has dims {group.dims}")
    _, first = np.unique(np.asarray(group.values), return_index=True)
    return str(group.dims[0]), tuple(int(i) for i in np.sort(first))


def partials_outweigh_data(
    da: xr.DataArray, *, dim: str, group_starts: tuple[int, ...], reduction: str, **_: Any
) -> str:
    """Why map-reduce cannot need less memory than blockwise here; ``""`` where it can.

    A combine task joins :func:`~.reductions.split_every` (4) chunks' partial results, each
    holding every group of the data per location, whatever the chunk's length. Where that is
    at least the whole dim's data per location (a day-of-year climatology: 4 x 366 partials
    against 1460 days), map-reduce holds more per location than blockwise's tasks, which read
    the dim whole.
    """
    length = int(da.sizes[dim])
    groups = sum(1 for s in group_starts if s < length)
    partial = PARTIAL_BYTES.get(reduction) or np.dtype(da.dtype).itemsize
    fan_in = split_every()
    combined = fan_in * groups * partial
    whole = length * np.dtype(da.dtype).itemsize
    if combined < whole:
        return ""
    return (
        f"map-reduce's combine tasks hold {fan_in} x {groups} groups' partial results "
        f"per location ({combined} B), more than the whole of {dim!r} ({length} steps, "
        f"{whole} B): method='blockwise' needs less memory"
    )


def _arguments(
    by: str | None = None,
    reduction: str = "mean",
    method: str | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """The arguments checked, with their defaults."""
    reject_unknown(Groupby.name, unknown, _arguments)
    if not isinstance(by, str) or not by:
        raise MemchunkError(
            "groupby needs by=, a coordinate's name, e.g. memchunk.apply('groupby', "
            "by='time.month') for da.groupby('time.month').mean()"
        )
    if reduction not in REDUCTIONS:
        raise MemchunkError(
            f"groupby reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}"
        )
    if method is not None and method not in METHODS:
        raise MemchunkError(
            f"groupby method must be one of {', '.join(METHODS)} or None (the plan chooses), "
            f"got {method!r}"
        )
    if method == "map-reduce" and reduction not in PARTIAL_BYTES:
        raise MemchunkError(
            f"groupby {reduction} has no partial results to combine: it needs "
            f"method='blockwise' (or None)"
        )
    return {"by": by, "reduction": reduction, "method": method}


class Groupby(Operator):
    """A grouped reduction: ``da.groupby(by).<reduction>()``, by flox's method the plan picks.

    Keyword Arguments:
    -----------------
    by : str
        A 1-D coordinate, or a part of a time coordinate (``"time.month"``,
        ``"time.dayofyear"``, ``"time.season"``).
    reduction : str, default "mean"
        One of :data:`REDUCTIONS`.
    method : {"map-reduce", "blockwise"}, optional
        flox's method; by default the plan prices both and takes the faster that fits.
    """

    keeps_unplanned_variables = True

    name = "groupby"
    description = (
        "xarray .groupby(by).<reduction>() (by=, reduction=): flox's map-reduce or "
        "blockwise method, chosen with the chunks"
    )
    dtype_kinds = "iuf"
    #: Measured on its first plan for each grouping, reduction and method: nothing is shipped.
    shipped_calibrations = ()
    #: Both methods are planned and the faster that fits is taken.
    chooses_fastest = True

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs; with ``da``, find its groups.

        With ``da``: ``dim`` (the grouped dim) and ``group_starts`` (:func:`group_starts`) are
        added: a task's partial results grow with the number of groups.

        Raises
        ------
        MemchunkError
            On a missing or invalid argument, an unknown one, or ``by`` not a 1-D coordinate.
        InfeasiblePlanError
            For map-reduce where a combine task's partial results per location outweigh the
            whole dim's data (:func:`partials_outweigh_data`): blockwise then needs less.
        """
        if da is None:
            return _arguments(**kwargs)
        dim, starts = group_starts(da, kwargs["by"])
        checked = dict(kwargs) | {"dim": dim, "group_starts": starts}
        if checked["method"] == "map-reduce" and (why := partials_outweigh_data(da, **checked)):
            raise InfeasiblePlanError(why)
        return checked

    def alternatives(self, kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, str]]:
        """The method given, else map-reduce and blockwise (blockwise alone for the median)."""
        if kwargs["method"] is not None:
            methods = [kwargs["method"]]
        elif kwargs["reduction"] in PARTIAL_BYTES:
            methods = list(METHODS)
        else:
            methods = ["blockwise"]
        # xarray without flox reduces each group itself: the method is the chunks' layout only
        off = "" if flox_enabled() else " (flox is off: its chunk layout, xarray reduces)"
        return [(f"method={m!r}{off}", kwargs | {"method": m}, "") for m in methods]

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list]:
        """None: a groupby groups the data's own coordinate, so it is measured on its first plan.

        Raises
        ------
        MemchunkError
            Always.
        """
        raise not_calibrated_apart("groupby", "by")

    def dims(self, da: xr.DataArray, **kwargs: Any) -> dict[str, DimUse]:
        """The grouped dim: whole for blockwise, free for map-reduce; the others free."""
        role = DimRole.WHOLE if kwargs["method"] == "blockwise" else DimRole.FREE
        return {kwargs["dim"]: DimUse(role)}

    def tree_shapes(self, extents: Mapping[str, int], **kwargs: Any) -> list[tuple[dict, dict]]:
        """Map-reduce: the largest block measured, cut into 8 and 32 chunks along the grouped dim.

        Their graphs hold partial results and combine tasks, which single chunks never do.
        """
        dim, length = kwargs["dim"], extents[kwargs["dim"]]
        if kwargs["method"] != "map-reduce":
            return []
        return [
            (dict(extents) | {dim: -(-length // n)}, dict(extents))
            for n in _TREE_CHUNKS
            if length >= 2 * n
        ]

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """Measured on the first plan, per grouping, reduction and method.

        Features: the input's bytes; for map-reduce also ``partial_bytes`` (a task's partial
        results: every group of the data per location of the chunk) and ``combine_bytes``
        (the partials a combine task concatenates, doubled where the tree has more levels),
        as for the tree reductions (:mod:`~xarray_memchunk.operators.reductions`).
        """
        itemsize = np.dtype(da.dtype).itemsize
        dim, reduction, method = kwargs["dim"], kwargs["reduction"], kwargs["method"]
        length = int(da.sizes[dim])
        groups = sum(1 for s in kwargs["group_starts"] if s < length)
        partial = PARTIAL_BYTES.get(reduction) or itemsize
        key = f"groupby-{kwargs['by']}-{reduction}-{method}"

        def features(padded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            elements = padded_elements(padded)
            values = {"input_bytes": elements * itemsize}
            if method == "blockwise":
                return values
            along = np.asarray(padded[dim], dtype=np.float64)
            partials = elements / along * groups * partial
            fan_in, depth = tree_shape(np.ceil(length / along), 1)
            values["partial_bytes"] = partials
            values["combine_bytes"] = np.where(
                fan_in > 1, partials * fan_in * np.minimum(depth, 2), 0.0
            )
            return values

        return Cost(key, features, None, seconds_per_element=2e-9, measurable=True)

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """The grouped reduction of ``da`` (chunked per the plan) by xarray, with flox's method."""
        return _grouped(da, **kwargs)

    def compute_dataset(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> xr.Dataset:
        """The grouped reduction of the planned variables and of those without the dim."""
        kept, dates = grouped_variables(ds, uses, kwargs["dim"], kwargs["reduction"])
        result = _grouped(kept, **kwargs)
        if dates:  # with xarray's own method (see grouped_variables)
            groups = ds[dates].groupby(kwargs["by"])
            result = result.assign(getattr(groups, kwargs["reduction"])().data_vars)
        return result

    def kept_unplanned(
        self, ds: xr.Dataset, uses: Mapping[str, Mapping[str, DimUse]], **kwargs: Any
    ) -> list[str]:
        """Those :func:`~.grouping.grouped_variables` computes beside the planned ones."""
        return kept_by_grouping(ds, uses, kwargs["dim"], kwargs["reduction"])

    def skipped(self, da: xr.DataArray, reason: str, **kwargs: Any) -> str:
        """A variable without the grouped dim, or dates: as xarray treats it."""
        dim = kwargs.get("dim")
        note = None if dim is None else note_unplanned(da, dim, "groups", kwargs["reduction"])
        return note or super().skipped(da, reason, **kwargs)


def _grouped(obj: Any, *, by: str, reduction: str, method: str, **_: Any) -> Any:
    """``obj.groupby(by).<reduction>()``, with flox's ``method`` where xarray uses flox."""
    options = {"method": method} if uses_flox(obj) else {}
    return getattr(obj.groupby(by), reduction)(**options)


#: Registered as a built-in operator (:func:`~xarray_memchunk.operators.registry.load_builtins`).
BUILTINS = (Groupby(),)

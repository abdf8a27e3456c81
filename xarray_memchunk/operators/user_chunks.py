"""Chunks the user gives (``chunks=`` of ``plan``, as ``.chunk()`` takes them), made plannable.

:func:`normalize_user_chunks` turns them into a tuple of chunk lengths for every planned dim,
then fits them to the operator: a dim it needs whole becomes one chunk (a caution: the plan
warns), chunks shorter than the operator's shortest (a halo's depth) are merged into their
neighbours, as ``map_overlap`` would, and chunks of a dim the operator cuts at boundaries only
(a resample's bins) end at the next boundary (notes): the plan describes the chunks that will
run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dask.array
import numpy as np
import xarray as xr

from .._dask_compat import ensure_minimum_chunksize
from ..errors import DimensionError, MemchunkError
from ..planning.problem import DimRole, DimSpec

__all__ = ["Chunks", "normalize_user_chunks"]

#: Chunks as ``plan(chunks=...)`` takes them: ``.chunk()``'s forms, or None for none given.
Chunks = Mapping[str, Any] | str | int | None


def normalize_user_chunks(
    chunks: Chunks,
    targets: Mapping[str, xr.DataArray],
    specs: tuple[DimSpec, ...],
    cautions: list[str],
    notes: list[str],
) -> dict[str, tuple[int, ...]]:
    """Turn ``.chunk()``-style chunks into chunk tuples for every planned dim.

    Chunks that split a dim the operator needs whole are merged, with a line in ``cautions``;
    halo chunks shorter than the halo are merged into their neighbours (as ``map_overlap``
    would), with a line in ``notes``: the plan describes the chunks that will run.

    Parameters
    ----------
    chunks
        As ``.chunk()`` takes them: one value for every dim, or a mapping of dim to value.
    targets
        The planned variables (their current chunks stand for dims ``chunks`` leaves out).
    specs
        The planned dims.
    cautions
        Appended to: a line per whole dim the chunks split.
    notes
        Appended to: a line per dim whose short chunks were merged.

    Returns
    -------
    dict of str to tuple of int
        Chunk lengths per planned dim.

    Raises
    ------
    DimensionError
        When ``chunks`` name dims the data lacks.
    MemchunkError
        When a dim's value is not a chunking of it.
    """
    dtype = next(iter(targets.values())).dtype
    given = _by_dim(chunks, specs)
    result = _normalized(given, _current_chunks(targets), specs, dtype)
    for spec in specs:
        # the input's own chunks along a dim not given are rechunked whole as a plan would
        cautioned = cautions if spec.name in given else []
        result[spec.name] = _whole_where_needed(spec, result[spec.name], cautioned)
        if spec.boundaries:
            result[spec.name] = _at_boundaries(spec, result[spec.name], notes)
        else:
            result[spec.name] = _short_chunks_merged(spec, result[spec.name], notes)
    return result


def _by_dim(chunks: Chunks, specs: tuple[DimSpec, ...]) -> Mapping[str, Any]:
    """``chunks`` as a mapping of dim to value; one value given stands for every dim.

    Parameters
    ----------
    chunks
        As :func:`normalize_user_chunks` takes them.
    specs
        The planned dims.

    Returns
    -------
    Mapping of str to value

    Raises
    ------
    DimensionError
        When ``chunks`` name dims the data lacks.
    """
    if not isinstance(chunks, Mapping):
        chunks = {s.name: chunks for s in specs}
    unknown = set(chunks) - {s.name for s in specs}
    if unknown:
        raise DimensionError(
            f"chunks name dims {sorted(map(str, unknown))} that the data lacks; "
            f"dims are {[s.name for s in specs]}"
        )
    return chunks


def _current_chunks(targets: Mapping[str, xr.DataArray]) -> dict[str, tuple[int, ...]]:
    """The chunks the chunked variables have now, per dim (the last variable's for a shared dim).

    Parameters
    ----------
    targets
        The planned variables.

    Returns
    -------
    dict of str to tuple of int
    """
    return {
        str(d): c
        for t in targets.values()
        if t.chunks
        for d, c in zip(t.dims, t.chunks, strict=True)
    }


def _normalized(
    chunks: Mapping[str, Any],
    current: Mapping[str, tuple[int, ...]],
    specs: tuple[DimSpec, ...],
    dtype: np.dtype,
) -> dict[str, tuple[int, ...]]:
    """Each planned dim's chunk lengths, as dask normalises the given (else current) value.

    A dim neither given nor chunked now is one chunk. ``"auto"`` sizes depend on every dim at
    once: where one is given, all dims are normalised together.

    Parameters
    ----------
    chunks
        Dim -> value, as given.
    current
        Dim -> its chunks now.
    specs
        The planned dims.
    dtype
        The data's dtype (for ``"auto"``).

    Returns
    -------
    dict of str to tuple of int

    Raises
    ------
    MemchunkError
        When a value is not a chunking of its dim.
    """
    result: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        value = chunks.get(spec.name, current.get(spec.name, -1))
        _check_chunk_value(spec.name, value)
        try:
            (normalized,) = dask.array.core.normalize_chunks(
                (value,), shape=(spec.size,), dtype=dtype
            )
        except (ValueError, TypeError) as exc:
            raise MemchunkError(f"invalid chunks for dim {spec.name!r}: {value!r} ({exc})") from exc
        result[spec.name] = tuple(int(c) for c in normalized)
    if any(v == "auto" for v in chunks.values()):  # "auto" sizes depend on every dim at once
        shape = tuple(s.size for s in specs)
        spec_chunks = tuple(chunks.get(s.name, result[s.name]) for s in specs)
        auto = dask.array.core.normalize_chunks(spec_chunks, shape=shape, dtype=dtype)
        result = {s.name: tuple(int(c) for c in a) for s, a in zip(specs, auto, strict=True)}
    return result


def _check_chunk_value(dim: str, value: Any) -> None:
    """Check one dim's ``.chunk()`` value.

    A positive int, -1 or None (the whole dim), ``"auto"``, or a tuple of positive ints.

    Parameters
    ----------
    dim
        The dim's name (for the error).
    value
        What was given for it.

    Raises
    ------
    MemchunkError
        When ``value`` is none of those.
    """
    if value is None or value == -1 or (isinstance(value, str) and value == "auto"):
        return
    values = value if isinstance(value, tuple | list) else (value,)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v <= 0:
            raise MemchunkError(
                f"invalid chunks for dim {dim!r}: {value!r}; give a positive length, -1 for "
                f"the whole dim, 'auto', or a tuple of positive lengths"
            )


def _whole_where_needed(
    spec: DimSpec, split: tuple[int, ...], cautions: list[str]
) -> tuple[int, ...]:
    """One chunk for a dim the operator needs whole that the chunks split, with a caution.

    Parameters
    ----------
    spec
        The dim.
    split
        Its chunk lengths.
    cautions
        Appended to where the dim was split.

    Returns
    -------
    tuple of int
    """
    if spec.role is DimRole.WHOLE and len(split) > 1:
        cautions.append(
            f"{spec.name!r} must be one chunk for this operator; the given chunks split it "
            f"in {len(split)}: it will be rechunked whole"
        )
        return (spec.size,)
    return split


def _short_chunks_merged(
    spec: DimSpec, split: tuple[int, ...], notes: list[str]
) -> tuple[int, ...]:
    """Chunks shorter than the operator's shortest merged into their neighbours, with a note.

    As dask's ``map_overlap`` does for a halo: the dim is one chunk where it is shorter than
    the shortest chunk itself.

    Parameters
    ----------
    spec
        The dim.
    split
        Its chunk lengths.
    notes
        Appended to where chunks were merged.

    Returns
    -------
    tuple of int
    """
    shortest = spec.shortest_chunk
    if not (len(split) > 1 and min(split) < shortest):
        return split
    merged = ensure_minimum_chunksize(shortest, split) if spec.size >= shortest else ()
    result = merged or (spec.size,)
    halo = spec.halo_depth == shortest
    why = f"the operator's shortest chunk, {shortest}"
    if halo:
        why = f"its halo of {shortest}"
    notes.append(
        f"chunks along {spec.name!r} shorter than {why}, merged into their neighbours"
        + (", as dask's map_overlap does" if halo else "")
        + f": {result}"
    )
    return result


def _at_boundaries(spec: DimSpec, split: tuple[int, ...], notes: list[str]) -> tuple[int, ...]:
    """Each chunk's end moved to the next of the dim's boundaries, with a note.

    Chunks that end at the same boundary become one: every chunk holds whole spans (a
    resample's bins, which the operator never cuts).

    Parameters
    ----------
    spec
        The dim, with its boundaries.
    split
        Its chunk lengths.
    notes
        Appended to where chunks moved.

    Returns
    -------
    tuple of int
    """
    edges = np.asarray(spec.boundaries)
    ends = np.unique(edges[np.searchsorted(edges, np.cumsum(split), side="left")])
    result = tuple(int(n) for n in np.diff(ends, prepend=0))
    if result != tuple(split):
        notes.append(
            f"chunks along {spec.name!r} end where the operator allows (whole bins, never "
            f"cut): {len(result)} chunks of up to {max(result)}"
        )
    return result

"""Check that a user's block function reaches no further along a dim than it declares.

A function applied block by block gives the values it gives on the whole array only where each
block holds every neighbour it reads: its halo (``depth=``) along the dims it smooths, nothing
along those it treats point by point. A smaller halo than the function's reach (a Gaussian of
sigma 2 reaches 8 elements with SciPy's ``truncate=4``; a function declared free along a dim it
filters) gives values that differ near every chunk boundary, silently. So at plan time the
function runs on a small random array whole and cut in two along each dim it may be cut along,
each half with its declared halo (:func:`check_reach`): where the halves differ from the whole,
the plan is refused before anything runs, with the halo that matched. The trial is
``2 x (halo + 8)`` long along the dim cut and 16 along the others: the seed's GST3D (eigh per
voxel, a halo of 10) is checked along its three dims in about 0.3 s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError
from ..planning.problem import halo_sides

__all__ = ["MAX_REACH", "check_free_dims", "check_reach"]

#: The widest halo the check tries before saying a dim must be whole.
MAX_REACH = 64
#: Elements each half holds beyond the reach tried.
_MARGIN = 8
#: Length of the dims a trial does not cut (the function's reach along them is not compared).
_OTHER_LENGTH = 16
#: Relative difference (of the result's largest magnitude) below which halves and whole agree:
#: rounding that depends on the block's shape (pairwise sums, FFTs) is far below it.
_TOLERANCE = 1e-4


def check_reach(
    func: Callable[..., Any],
    sizes: Mapping[str, int],
    dtype: np.dtype,
    cut: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    operator: str,
    kept: Sequence[str] | None = None,
) -> None:
    """Refuse ``func`` where it reaches further than its halo along a dim it may be cut along.

    Parameters
    ----------
    func
        The block function, ``func(block, **kwargs)``.
    sizes
        The data's dims and lengths, in order.
    dtype
        The data's dtype.
    cut
        The dims a plan may cut, each with its declared halo (0 where none).
    kwargs
        The function's keyword arguments.
    operator
        The operator's name, for the message.
    kept
        The dims of ``func``'s result, in order (its input's less those it drops); the
        input's where None.

    Raises
    ------
    MemchunkError
        Where a dim's halves differ from the whole: the halo that matched, or that the dim
        must be whole.
    """
    dims = list(sizes)
    kept = list(dims if kept is None else kept)
    found: dict[str, int | None] = {}  # each dim read further than declared: the halo that agrees
    for dim, depth in cut.items():
        before, after = halo_sides(depth)
        halo = max(before, after)
        if dim not in kept or sizes[dim] < 2 * (halo + 2):
            continue  # too short a dim to cut in two with its halo
        axes = dims.index(dim), kept.index(dim)

        def trial(length: int, seed: int, end: int | None = None, dim: str = dim) -> _Trial:
            shape = [min(sizes[d], length if d == dim else _OTHER_LENGTH) for d in dims]
            x = _random(shape, dtype, seed)
            if end is not None:
                _spike(x, dims.index(dim), end)
            return _Trial(func, x, dims.index(dim), kept.index(dim), kwargs)

        short = trial(2 * (halo + _MARGIN), 0)
        if short.whole is None or short.agrees(before, after):
            continue
        # a function of the whole block (divided by its maximum) agrees by chance where both
        # halves hold what it depends on: so must other data, and data with a spike at one end
        # of the dim, then the other, which a halo short of the dim leaves out of a half
        length = 2 * (MAX_REACH + _MARGIN)
        trials = [trial(length, 0), trial(length, 1), trial(length, 2, 0), trial(length, 3, -1)]
        trials = [t for t in trials if t.whole is not None]
        most = min(trials[0].x.shape[axes[0]] // 2 - 1, MAX_REACH)
        found[dim] = _least_agreeing(trials, halo + 1, most)
    if found:
        raise MemchunkError(_message(operator, cut, found))


def _least_agreeing(trials: Sequence[_Trial], least: int, most: int) -> int | None:
    """The least halo (both sides), from ``least`` to ``most``, all ``trials`` agree at.

    Doubling to one that agrees, then halving the gap (a halo at or beyond the function's
    reach always agrees); None where none up to ``most`` does.
    """

    def agree(halo: int) -> bool:
        return all(t.agrees(halo, halo) for t in trials)

    low, high = least - 1, least
    while not agree(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if agree(middle) else (middle, high)
    return high


def check_free_dims(
    func: Callable[..., Any],
    sample: xr.DataArray,
    free: Sequence[str],
    kwargs: Mapping[str, Any],
    operator: str,
) -> None:
    """Refuse an xarray function whose values along a free dim depend on their neighbours.

    ``sample`` is a small piece of the data with its coordinates (its whole dims entire);
    its values are replaced by random ones. Along each free dim, the function's result on the
    sample cut in two must equal its result on the whole sample: a task sees its chunk only.

    Raises
    ------
    MemchunkError
        Naming the free dims along which the halves differ: declare them whole.
    """
    if sample.dtype.kind not in "biufc":
        return
    data = _random(sample.shape, sample.dtype, 0)
    for axis, end in ((0, 0), (sample.ndim - 1, -1)):
        if sample.ndim:
            _spike(data, axis, end)
    sample = sample.copy(data=data)
    whole = _xarray_call(func, sample, kwargs)
    if whole is None:
        return
    differ = []
    for dim in free:
        if sample.sizes[dim] < 4:
            continue
        middle = sample.sizes[dim] // 2
        halves = [
            _xarray_call(func, sample.isel({dim: part}), kwargs)
            for part in (slice(0, middle), slice(middle, None))
        ]
        if any(h is None for h in halves) or not _joined_equal(halves, whole, dim):
            differ.append(dim)
    if differ:
        raise MemchunkError(
            f"operator {operator!r} is declared free along {differ}, but its result there "
            f"depends on neighbours: run on a small random piece of the data cut in two along "
            f"each, its values differ from the uncut piece's, as they would between chunks; "
            f"declare them whole (whole=[...]) or leave them out of free="
        )


def _xarray_call(func: Callable[..., Any], obj: xr.DataArray, kwargs: Any) -> Any:
    """``func(obj)`` computed, or None where it fails (it is checked when it runs instead)."""
    try:
        with np.errstate(all="ignore"):
            out = func(obj, **kwargs)
        return out.compute() if isinstance(out, xr.DataArray | xr.Dataset) else None
    except Exception:  # the user's function failed on the piece: not checked
        return None


def _joined_equal(halves: Sequence[Any], whole: Any, dim: str) -> bool:
    """Whether ``halves`` of a result, joined along ``dim``, give ``whole``'s values."""
    try:
        joined = xr.concat(halves, dim=dim, data_vars="all", coords="minimal", compat="override")
    except (ValueError, TypeError, KeyError):  # halves xarray cannot join: not compared
        return True
    pairs = (
        [(joined[n], whole[n]) for n in whole.data_vars]
        if isinstance(whole, xr.Dataset)
        else [(joined, whole)]
    )
    for got, want in pairs:
        if dim not in want.dims or got.shape != want.transpose(*got.dims).shape:
            continue
        a, b = np.asarray(got.values), np.asarray(want.transpose(*got.dims).values)
        if b.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                return False
            continue
        scale = float(np.nanmax(np.abs(b), initial=0.0)) or 1.0
        if not np.allclose(a, b, rtol=_TOLERANCE, atol=_TOLERANCE * scale, equal_nan=True):
            return False
    return True


def _random(shape: Sequence[int], dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "fc":
        return rng.standard_normal(shape).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _spike(x: np.ndarray, axis: int, end: int) -> None:
    """Set the ``end`` (0 or -1) of ``x`` along ``axis`` far above the rest (booleans: True)."""
    kind = x.dtype.kind
    value = 1e3 if kind in "fc" else (np.iinfo(x.dtype).max // 2 if kind in "iu" else 1)
    index = [slice(None)] * x.ndim
    index[axis] = end
    x[tuple(index)] = value


class _Trial:
    """One dim's trial: the function on the whole array, and on halves with a halo."""

    def __init__(
        self, func: Callable[..., Any], x: np.ndarray, axis: int, out_axis: int, kwargs: Any
    ) -> None:
        self.func, self.x, self.axis, self.out_axis, self.kwargs = func, x, axis, out_axis, kwargs
        self.middle = x.shape[axis] // 2
        self.whole = self._call(x)

    def _call(self, block: np.ndarray) -> np.ndarray | None:
        """The function's result, or None where it fails (checked when it runs, instead)."""
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(self.func(block, **self.kwargs))
        except Exception:  # the user's function failed on the trial array: not checked
            return None
        return out if out.ndim > self.out_axis else None

    def _take(self, array: np.ndarray, axis: int, start: int, stop: int | None) -> np.ndarray:
        index = [slice(None)] * array.ndim
        index[axis] = slice(start, stop)
        return array[tuple(index)]

    def agrees(self, before: int, after: int) -> bool:
        """Whether the halves, with ``before`` and ``after`` neighbours, give the whole's values."""
        m = self.middle
        left = self._call(self._take(self.x, self.axis, 0, m + after))
        right = self._call(self._take(self.x, self.axis, m - before, None))
        if left is None or right is None:
            return True  # the function failed on a half: nothing to compare
        halves = [
            self._take(left, self.out_axis, 0, m),
            self._take(right, self.out_axis, before, None),
        ]
        try:
            joined = np.concatenate(halves, axis=self.out_axis)
        except ValueError:  # halves of another shape than the whole's: not a block function
            return True
        if joined.shape != self.whole.shape:
            return True
        if self.whole.dtype.kind not in "fc":
            return bool(np.array_equal(joined, self.whole))
        scale = float(np.nanmax(np.abs(self.whole), initial=0.0)) or 1.0
        return bool(
            np.allclose(
                joined, self.whole, rtol=_TOLERANCE, atol=_TOLERANCE * scale, equal_nan=True
            )
        )


def _message(operator: str, cut: Mapping[str, Any], found: Mapping[str, int | None]) -> str:
    """The refusal: which dims read further than declared, and what to declare instead."""

    def declared(depth: Any) -> str:
        return f"a halo of {depth!r}" if depth else "no halo"

    reads = "; ".join(f"along {d!r} than {declared(cut[d])}" for d in found)
    fixes = []
    halos = {d: n for d, n in found.items() if n is not None}
    whole = [d for d, n in found.items() if n is None]
    if halos:
        depth = {d: k for d, k in cut.items() if k and d not in whole} | halos
        agreeing = ", ".join(f"{n} along {d!r}" for d, n in halos.items())
        fixes.append(f"they agree with {agreeing} per side: declare depth={depth}")
    if whole:
        fixes.append(
            f"no halo up to {MAX_REACH} per side (or half the dim) made {whole} agree: declare "
            f"whole={whole}, or a depth that covers its reach"
        )
    return (
        f"operator {operator!r} reads further {reads}: run on a small random array cut in two "
        f"along each with that halo, its values near the cut differ from the uncut array's, as "
        f"they would near every chunk boundary; {'; '.join(fixes)}"
    )

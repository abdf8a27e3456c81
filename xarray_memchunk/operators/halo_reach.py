"""Check that a user's function reaches no further along a dim than it declares.

A function applied block by block gives the values it gives on the whole array only where each
block holds every neighbour it reads: its halo (``depth=``) along the dims it smooths, nothing
along those it treats point by point. A smaller halo than the function's reach (a Gaussian of
sigma 2 reaches 8 elements with SciPy's ``truncate=4``; a function declared free along a dim it
filters) gives values that differ near every chunk boundary, silently. So at plan time the
function runs on small arrays whole and cut in two along each dim a plan may cut, each half with
its declared halo (:func:`check_reach`; :func:`check_free_dims` for a function of xarray
objects): where the halves differ from the whole, the plan is refused before anything runs,
with the halo that agrees.

The arrays (:func:`_trial_data`): random values, the same with a spike at either end of the
dim (a function of the block's maximum), and with a run of NaN on either side of the cut
(filling gaps from neighbours). A reach that only values beyond a threshold trigger is found
only where a spike lies within it. A function that gives two results for
one array (random noise) is not checked, nor are arrays it fails on, nor an all-NaN result. The
dask config key ``memchunk.check-reach`` (False) turns the check off, for a halo you keep short
of the function's reach on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..errors import MemchunkError
from ..planning.problem import halo_sides

__all__ = [
    "MAX_REACH",
    "MAX_TRIAL_ELEMENTS",
    "check_free_dims",
    "check_reach",
    "checking",
    "piece_of",
]

#: The widest halo the check tries before saying a dim must be whole.
MAX_REACH = 64
#: Elements of the largest array a function is checked on: the check of an xarray function,
#: whose whole dims are entire, is skipped above it (a 0.1 degree grid whole along lat and lon).
MAX_TRIAL_ELEMENTS = 1 << 22
#: Elements each half holds beyond the reach tried.
_MARGIN = 8
#: Length of the dims a block trial does not cut (the function's reach along them is not
#: compared).
_OTHER_LENGTH = 8
#: Length of a free dim an xarray function's trial cuts; the other free dims are 2 long.
_FREE_LENGTH = 32
#: Relative difference (of the result's largest finite magnitude) below which halves and whole
#: agree: rounding that depends on the block's shape (pairwise sums, FFTs) is far below it.
_TOLERANCE = 1e-4
#: The tolerance of the search for the halo that agrees: at the function's reach, halves give
#: the whole's values to rounding, where a halo short of it may already pass :data:`_TOLERANCE`
#: (the seed's GST3D, whose reach is 10, agreed at 9 along some dims).
_SEARCH_TOLERANCE = 1e-6
#: The search's first tolerance for a result of float64 (or wider): its rounding is far below
#: :data:`_SEARCH_TOLERANCE`, where a Gaussian's tail short of its reach is not. A new user's
#: float64 function of reach 12 was told {11, 10, 10} at 1e-6, which gave 1.28e-6 of the
#: largest value on white noise cut in other chunks.
_FLOAT64_SEARCH_TOLERANCE = 1e-9


def checking() -> bool:
    """Whether functions are checked (the dask config key ``memchunk.check-reach``)."""
    import dask

    return bool(dask.config.get("memchunk.check-reach", True))


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
        Where a dim's halves differ from the whole: the halo that agrees, or that the dim
        must be whole.
    """
    dims = list(sizes)
    kept = list(dims if kept is None else kept)
    searches: dict[str, Callable[[], tuple[int, int] | None]] = {}
    short_of_reach: list[str] = []
    for dim, depth in cut.items():
        before, after = halo_sides(depth)
        if dim not in kept or sizes[dim] < 2 * (max(before, after) + 2):
            continue  # too short a dim to cut in two with its halo
        axis, out_axis = dims.index(dim), kept.index(dim)

        def trials(
            length: int, gap: int, dim: str = dim, axis: int = axis, out_axis: int = out_axis
        ):
            shape = [min(sizes[d], length if d == dim else _OTHER_LENGTH) for d in dims]
            for i, x in enumerate(_trial_data(shape, dtype, axis, gap)):
                trial = _Trial(func, x, axis, out_axis, kwargs)
                if i == 0 and not trial.repeats():
                    return  # noise, or fails: nothing to compare
                if trial.checkable:
                    yield trial

        halo = max(before, after)
        short = list(trials(2 * (halo + _MARGIN), halo + 2))
        if not all(t.agrees(before, after) for t in short):
            short_of_reach.append(dim)

        def search(short=short, trials=trials, axis=axis) -> tuple[int, int] | None:
            # longer arrays, with runs of NaN longer than any halo tried, and the short ones
            # again (what it finds must agree there too)
            long = list(trials(2 * (MAX_REACH + _MARGIN), MAX_REACH + 2))
            most = min(max(t.x.shape[axis] for t in short + long) // 2 - 1, MAX_REACH)
            return _least_halo(short + long, most)

        if short:  # a dim whose trials the function failed on, or gave noise, is not compared
            searches[dim] = search
    if not short_of_reach:
        return
    # every dim searched, not only those short of their reach: a halo within the check's
    # tolerance (a Gaussian's tail, 1.2e-4 at 8 of a reach of 12) and one found to rounding
    # would be suggested side by side, and agree only to the first
    found = {dim: searches[dim]() for dim in short_of_reach}
    for dim in searches.keys() - found.keys():
        halo = searches[dim]()
        declared = halo_sides(cut[dim])
        wider = declared if halo is None else tuple(map(max, halo, declared))
        if wider != declared:  # never less than declared: its reach may lie beyond the trials
            found[dim] = wider
    found = {dim: found[dim] for dim in cut if dim in found}  # in the data's order
    raise MemchunkError(_message(operator, cut, found, short_of_reach))


def check_free_dims(
    func: Callable[..., Any],
    data: xr.DataArray,
    free: Sequence[str],
    kwargs: Mapping[str, Any],
    operator: str,
) -> None:
    """Refuse an xarray function whose values along a free dim depend on their neighbours.

    ``data`` is the data (its coordinates are used, not its values). Along each free dim, a
    piece of it (its whole dims entire, :data:`_FREE_LENGTH` of that dim, 2 of the other free
    ones) is given random values, and the function's result on the piece cut in two must equal
    its result on the whole piece: a task sees its chunk only. Skipped where such a piece holds
    more than :data:`MAX_TRIAL_ELEMENTS`.

    Raises
    ------
    MemchunkError
        Naming the free dims along which the halves differ: declare them whole.
    """
    if data.dtype.kind not in "biufc":
        return
    differ = []
    whole_dims = math.prod(n for d, n in data.sizes.items() if d not in free)
    for dim in free:
        lengths = {d: min(data.sizes[d], _FREE_LENGTH if d == dim else 2) for d in free}
        if lengths[dim] < 4 or whole_dims * math.prod(lengths.values()) > MAX_TRIAL_ELEMENTS:
            continue
        piece = piece_of(data, lengths)
        axis = piece.get_axis_num(dim)
        for i, x in enumerate(_trial_data(piece.shape, data.dtype, axis, lengths[dim] // 2)):
            sample = piece.copy(data=x)
            whole = _xarray_call(func, sample, kwargs)
            if i == 0 and not _repeats(func, sample, kwargs, whole):
                break  # noise, or fails: nothing to compare
            if whole is None or all(_unchecked(np.asarray(w.values)) for w in _arrays(whole)):
                continue
            middle = lengths[dim] // 2
            halves = [
                _xarray_call(func, sample.isel({dim: part}), kwargs)
                for part in (slice(0, middle), slice(middle, None))
            ]
            if any(h is None for h in halves):
                continue  # the function fails on a half: checked when it runs instead
            if not _joined_equal(halves, whole, dim):
                differ.append(dim)
                break
    if differ:
        raise MemchunkError(
            f"operator {operator!r} may be cut along {differ} (not declared whole), but its "
            f"result there depends on neighbours: run on small random pieces of the data cut "
            f"in two along each, its values differ from the uncut piece's, as they would "
            f"between chunks; declare them whole (whole=[...]) or leave them out of free="
        )


def piece_of(
    data: xr.DataArray, lengths: Mapping[str, int], fill: float = 0, spread: bool = False
) -> xr.DataArray:
    """NumPy ``fill`` of ``data``'s dtype and dims, cut to ``lengths``, with its coordinates.

    Each dim of ``lengths`` keeps its first elements, or (``spread``) elements spread evenly
    from its first to its last (2 of longitude: 0.5 and 359.5). Nothing of ``data``'s values
    is read; its coordinates (a Dask-backed one too) are computed.
    """
    cut: dict[str, Any] = {d: slice(0, n) for d, n in lengths.items()}
    if spread:
        cut = {
            d: np.unique(np.linspace(0, data.sizes[d] - 1, n).round().astype(int))
            for d, n in lengths.items()
        }
    coords = {
        k: v.isel({d: cut[d] for d in v.dims if d in cut}).compute() for k, v in data.coords.items()
    }
    shape = tuple(len(np.arange(n)[cut[d]]) if d in cut else n for d, n in data.sizes.items())
    values = np.full(shape, fill, dtype=data.dtype)
    return xr.DataArray(values, dims=data.dims, coords=coords, name=data.name, attrs=data.attrs)


def _trial_data(shape: Sequence[int], dtype: np.dtype, axis: int, gap: int) -> Iterator[np.ndarray]:
    """The arrays a function is checked on (see the module's docstring).

    Random values; with a spike at the start of ``axis``, then at its end; for floats, with a
    run of NaN ``gap`` long (at most) ending at the middle of ``axis``, then one starting
    there: a function that fills gaps from the other side of the cut finds none in a half.
    """
    dtype = np.dtype(dtype)
    yield _random(shape, dtype, 0)
    for seed, end in ((1, 0), (2, -1)):
        x = _random(shape, dtype, seed)
        _set(x, axis, slice(end, None) if end == -1 else slice(0, 1), _spike_value(dtype))
        yield x
    middle = shape[axis] // 2
    if dtype.kind in "fc" and middle >= 2:
        for seed, run in (
            (3, slice(max(1, middle - gap), middle + 1)),
            (4, slice(middle - 1, min(shape[axis] - 1, middle + gap))),
        ):
            x = _random(shape, dtype, seed)
            _set(x, axis, run, np.nan)
            yield x


def _random(shape: Sequence[int], dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "f" and dtype.itemsize in (4, 8):
        return rng.standard_normal(shape, dtype=dtype)
    if dtype.kind in "fc":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _spike_value(dtype: np.dtype) -> Any:
    if dtype.kind in "fc":
        return 1e3
    return np.iinfo(dtype).max // 2 if dtype.kind in "iu" else True


def _set(x: np.ndarray, axis: int, where: slice, value: Any) -> None:
    index = [slice(None)] * x.ndim
    index[axis] = where
    x[tuple(index)] = value


def _same(got: np.ndarray, want: np.ndarray, tolerance: float = _TOLERANCE) -> bool:
    """Equal values (floats: within ``tolerance`` of the largest finite magnitude)."""
    if got.shape != want.shape:
        return False
    if want.dtype.kind not in "fc" or got.dtype.kind not in "fc":
        return bool(np.array_equal(got, want))
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return False
    if not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return False  # NaN and infinities, where they are
    scale = float(np.max(np.abs(want[finite]), initial=0.0)) or 1.0
    return bool(np.allclose(got[finite], want[finite], rtol=tolerance, atol=tolerance * scale))


def _unchecked(out: np.ndarray) -> bool:
    """An all-NaN result says nothing of where the function reads."""
    return out.dtype.kind in "fc" and out.size > 0 and bool(np.isnan(out).all())


class _Trial:
    """One array's trial along one dim: the function on it whole, and on halves with a halo."""

    def __init__(
        self, func: Callable[..., Any], x: np.ndarray, axis: int, out_axis: int, kwargs: Any
    ) -> None:
        self.func, self.x, self.axis, self.out_axis, self.kwargs = func, x, axis, out_axis, kwargs
        self.middle = x.shape[axis] // 2
        self.whole = self._call(x)
        # not where the function fails on it, or gives all NaN
        self.checkable = self.whole is not None and not _unchecked(self.whole)

    def repeats(self) -> bool:
        """Whether the function gives the same result again (not so with random noise)."""
        again = self._call(self.x) if self.whole is not None else None
        return again is not None and _same(again, self.whole)

    def _call(self, block: np.ndarray) -> np.ndarray | None:
        """The function's result, or None where it fails (checked when it runs, instead)."""
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(self.func(block.copy(), **self.kwargs))
        except Exception:  # the user's function failed on the trial array: not checked
            return None
        return out if out.ndim > self.out_axis else None

    def _take(self, array: np.ndarray, axis: int, start: int, stop: int | None) -> np.ndarray:
        index = [slice(None)] * array.ndim
        index[axis] = slice(start, stop)
        return array[tuple(index)]

    def agrees(self, before: int, after: int, tolerance: float = _TOLERANCE) -> bool:
        """Whether the halves, with ``before`` and ``after`` neighbours, give the whole's values."""
        m, n = self.middle, self.x.shape[self.axis]
        start, stop = max(0, m - before), min(n, m + after)  # a halo past the array's end
        left = self._call(self._take(self.x, self.axis, 0, stop))
        right = self._call(self._take(self.x, self.axis, start, None))
        if left is None or right is None:
            return True  # the function failed on a half: nothing to compare
        halves = [
            self._take(left, self.out_axis, 0, m),
            self._take(right, self.out_axis, m - start, None),
        ]
        try:
            joined = np.concatenate(halves, axis=self.out_axis)
        except ValueError:  # halves of another shape than the whole's: not a block function
            return True
        return joined.shape != self.whole.shape or _same(joined, self.whole, tolerance)


def _least_halo(trials: Sequence[_Trial], most: int) -> tuple[int, int] | None:
    """The least ``(before, after)`` halo, each side at most ``most``, every trial agrees at.

    Searched to rounding (:data:`_FLOAT64_SEARCH_TOLERANCE` first for results of float64,
    then :data:`_SEARCH_TOLERANCE`), else to the check's tolerance; None where even ``most``
    per side does not agree.
    """
    wide = all(
        t.whole is not None and t.whole.dtype.kind in "fc" and np.finfo(t.whole.dtype).eps < 1e-10
        for t in trials
    )
    for tolerance in (_FLOAT64_SEARCH_TOLERANCE,) * wide + (_SEARCH_TOLERANCE, _TOLERANCE):
        found = _least_halo_within(trials, most, tolerance)
        if found is not None:
            return found
    return None


def _least_halo_within(
    trials: Sequence[_Trial], most: int, tolerance: float
) -> tuple[int, int] | None:
    """:func:`_least_halo` at one tolerance.

    The least symmetric halo first (doubling to one that agrees, then halving the gap: a halo
    at or beyond the function's reach always agrees), then each side on its own with the other
    held there.
    """

    def agree(before: int, after: int) -> bool:
        return all(t.agrees(before, after, tolerance) for t in trials)

    def least(test: Callable[[int], bool], high: int) -> int:
        low = -1  # test(high) holds; find the least k in [0, high] where it does
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if test(middle) else (middle, high)
        return high

    if not agree(most, most):
        return None
    high = 1
    while not agree(high, high):
        high = min(2 * high, most)
    both = least(lambda k: agree(k, k), high)
    before = least(lambda k: agree(k, both), both)
    after = least(lambda k: agree(before, k), both)
    return before, after


def _xarray_call(func: Callable[..., Any], obj: xr.DataArray, kwargs: Any) -> Any:
    """``func(obj)`` computed, or None where it fails (it is checked when it runs instead)."""
    try:
        with np.errstate(all="ignore"):
            out = func(obj, **kwargs)
        return out.compute() if isinstance(out, xr.DataArray | xr.Dataset) else None
    except Exception:  # the user's function failed on the piece: not checked
        return None


def _arrays(result: Any) -> list[xr.DataArray]:
    return list(result.data_vars.values()) if isinstance(result, xr.Dataset) else [result]


def _repeats(func: Callable[..., Any], sample: xr.DataArray, kwargs: Any, whole: Any) -> bool:
    """Whether ``func`` gives ``whole`` again for ``sample`` (not so with random noise)."""
    again = _xarray_call(func, sample, kwargs) if whole is not None else None
    if again is None:
        return False
    pairs = zip(_arrays(again), _arrays(whole), strict=False)
    return all(_same(np.asarray(a.values), np.asarray(w.values)) for a, w in pairs)


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
        if dim not in want.dims or set(got.dims) != set(want.dims):
            continue
        if not _same(np.asarray(got.values), np.asarray(want.transpose(*got.dims).values)):
            return False
    return True


def _message(
    operator: str,
    cut: Mapping[str, Any],
    found: Mapping[str, tuple[int, int] | None],
    short_of_reach: Sequence[str],
) -> str:
    """The refusal: which dims read further than declared, and what to declare instead.

    ``found``: the halo that agrees to rounding along each dim short of its reach, and along
    any other whose declared halo agrees only to the check's tolerance.
    """

    def declared(depth: Any) -> str:
        return f"a halo of {depth!r}" if depth else "no halo"

    def halo(sides: tuple[int, int]) -> int | tuple[int, int]:
        # one-sided (a trailing window) as a pair; sides the tolerance sets apart, as one
        before, after = sides
        return (before, after) if min(sides) < max(sides) / 2 else max(sides)

    reads = "; ".join(f"along {d!r} than {declared(cut[d])}" for d in short_of_reach)
    fixes = []
    halos = {d: halo(n) for d, n in found.items() if n is not None}
    whole = [d for d, n in found.items() if n is None]
    if halos:
        depth = {d: k for d, k in cut.items() if k and d not in whole} | halos
        agreeing = ", ".join(f"{n!r} along {d!r}" for d, n in halos.items())
        fixes.append(
            f"they agree with a halo of {agreeing} (elements per side, or (before, after)): "
            f"declare depth={depth}"
        )
    if whole:
        fixes.append(
            f"no halo up to {MAX_REACH} per side (or half the dim) made {whole} agree: the "
            f"function reads the whole dim there (a cumulative sum, the block's mean): declare "
            f"whole={whole}, or a depth that covers its reach"
        )
    return (
        f"operator {operator!r} reads further {reads}: run on small random arrays cut in two "
        f"along each with that halo, its values near the cut differ from the uncut array's, as "
        f"they would near every chunk boundary; {'; '.join(fixes)} (dask config "
        f"memchunk.check-reach: False skips this check)"
    )

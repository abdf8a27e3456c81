"""The held-input term of a task slot's footprint, for inputs a Dask graph produces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xarray_memchunk.planning.footprint import (
    ALL_TO_ALL_COPIES,
    HELD_AHEAD,
    DimCut,
    InputKind,
    InputLayout,
    footprint,
)


def _cut(size: int, length: int) -> DimCut:
    n = math.ceil(size / length)
    return DimCut(
        size=size,
        lengths=np.array([length]),
        n_chunks=np.array([n]),
        padded=np.array([length]),
        units=np.array([1]),
        halo=False,
    )


def _held(source: dict[str, int], planned: dict[str, int], threads: int = 4) -> float:
    sizes = {"time": 3542, "lat": 73, "lon": 146}
    layout = InputLayout("v", tuple(sizes), 8, InputKind.GRAPH, source)
    cuts = {d: _cut(sizes[d], planned[d]) for d in sizes}
    terms = footprint(np.array([1e6]), cuts, [layout], threads_per_worker=threads, n_workers=1)
    return float(terms.held[0])


def test_every_task_reading_every_source_chunk_holds_the_array_twice():
    """Trial 44: one-step slabs rechunked to time whole, lat and lon cut (a pause, a hang)."""
    array = 3542 * 73 * 146 * 8
    held = _held({"time": 1, "lat": 73, "lon": 146}, {"time": 3542, "lat": 19, "lon": 17})
    assert held == pytest.approx(ALL_TO_ALL_COPIES * array / 4)


def test_tasks_reading_some_source_chunks_hold_those_ahead():
    # time-whole source chunks cut along lon: a task may straddle 2 of the 8 lon source chunks
    source = {"time": 3542, "lat": 73, "lon": 20}
    held = _held(source, {"time": 3542, "lat": 73, "lon": 10}, threads=1)
    covering = 3542 * 73 * (2 * 20) * 8
    assert held == pytest.approx((1 + HELD_AHEAD) * covering)
    # no more than the whole array, where that is less
    assert _held(source, {"time": 3542, "lat": 73, "lon": 10}) == 3542 * 73 * 146 * 8 / 4


@pytest.mark.parametrize(
    ("source_time", "threads", "making"), [(3542, 4, 1), (1771, 4, 2), (1, 4, 4), (3542, 1, 1)]
)
def test_no_more_slots_make_source_chunks_than_the_graph_has(source_time, threads, making):
    """Trial 92's kind: a graph of one or two large blocks, each holding 6 x itself while it is
    made; a worker of 4 threads makes at most as many at once as there are."""
    sizes = {"time": 3542, "lat": 73, "lon": 146}
    block = source_time * 73 * 146 * 8
    layout = InputLayout(
        "v",
        tuple(sizes),
        8,
        InputKind.GRAPH,
        {"time": source_time, "lat": 73, "lon": 146},
        produce_bytes=5 * block,
    )
    cuts = {"time": _cut(3542, source_time), "lat": _cut(73, 73), "lon": _cut(146, 146)}
    task = np.array([1e3])
    terms = footprint(task, cuts, [layout], threads_per_worker=threads, n_workers=1)
    # planned in the source chunks: one slot's larger phase is making its block
    assert float(terms.produce[0]) == pytest.approx(making / threads * (6 * block - 1e3))


def _gathered(store: dict[str, int], planned: dict[str, int], raw: bool) -> float:
    """The gather term of reading the planned blocks from a file in ``store`` chunks."""
    sizes = {"time": 2920, "lat": 288, "lon": 720}
    layout = InputLayout("v", tuple(sizes), 4, InputKind.FILE, store, raw_reads=raw)
    cuts = {d: _cut(sizes[d], planned[d]) for d in sizes}
    terms = footprint(np.array([1.0]), cuts, [layout], threads_per_worker=1, n_workers=2)
    return float(terms.gather[0])


def test_raw_chunks_read_in_place_hold_nothing_beside_the_block():
    planned = {"time": 2920, "lat": 288, "lon": 72}
    block = 2920 * 288 * 72 * 4
    # one chunk per block, or time slabs of it: each a contiguous run of the block
    for store in (planned, {"time": 130, "lat": 288, "lon": 72}):
        assert _gathered(store, planned, raw=True) == pytest.approx(block - 1.0)
    # chunks of half a block's lat rows are not runs of it: one chunk's buffer beside it
    half = {"time": 2920, "lat": 144, "lon": 72}
    assert _gathered(half, planned, raw=True) == pytest.approx(1.5 * block - 1.0)
    # compressed, each read decodes its group of chunks with copies beside the block
    assert _gathered(planned, planned, raw=False) > 3 * block

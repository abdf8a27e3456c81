"""The terms of a task slot's footprint beside the task: held input, producing it, reading it,
and Dask's record of the graph's tasks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xarray_memchunk.planning.footprint import (
    ALL_TO_ALL_COPIES,
    GRAPH_TASK_BYTES,
    HELD_AHEAD,
    DimCut,
    InputKind,
    InputLayout,
    footprint,
    graph_tasks,
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


@pytest.mark.parametrize(("held", "making"), [(0.0, 1 + 0.2), (1e8, 2)])
def test_slots_making_a_graph_s_largest_chunks_count_each_at_its_own_share(held, making):
    """Trial 38's kind: 3797 and 802 days of a 4599-day graph on 2 threads, planned time whole
    and cut along lon. One slot makes the large chunk, the other at most the remainder, at its
    share of the making; a fused task that keeps what its making held counts as the largest."""
    sizes = {"time": 4599, "lat": 47, "lon": 94}
    block = 3797 * 47 * 94 * 8
    layout = InputLayout(
        "v",
        tuple(sizes),
        8,
        InputKind.GRAPH,
        {"time": 3797, "lat": 47, "lon": 94},
        produce_bytes=2 * block,
        produce_held_bytes=held,
        making_shares=(1.0, 0.2),
    )
    # fused where the chunks are the source's (the kept bytes count there), else cut along lon
    planned = {"time": 3797, "lat": 47, "lon": 94} if held else {"time": 4599, "lat": 47, "lon": 5}
    cuts = {d: _cut(sizes[d], planned[d]) for d in sizes}
    if held:  # chunks of whole source chunks
        cuts["time"] = DimCut(4599, *(np.array([n]) for n in (3797, 2, 3797, 3797)), halo=False)
    task = np.array([1e6])
    terms = footprint(task, cuts, [layout], threads_per_worker=2, n_workers=1)
    made = max(1e6 + held, 3 * block) - 1e6
    assert float(terms.produce[0]) == pytest.approx(making / 2 * made)


def test_slots_make_the_largest_chunks_of_every_graph_and_count_uneven_chunks():
    """A Dataset's two variables, each one graph chunk, on 2 threads: both slots make one at
    once (each counted as one slot's before). Chunks of uneven lengths (100, 100, 50, 30 along
    time): 4 chunks, where the longest says 3."""
    sizes = {"time": 280, "lat": 73, "lon": 146}
    block = 100 * 73 * 146 * 8

    def layout(name, **kwargs):
        return InputLayout(
            name,
            tuple(sizes),
            8,
            InputKind.GRAPH,
            {"time": 100, "lat": 73, "lon": 146},
            produce_bytes=2 * block,
            **kwargs,
        )

    cuts = {"time": _cut(280, 280), "lat": _cut(73, 73), "lon": _cut(146, 10)}
    task = np.array([1e3])
    made = 3 * block - 1e3

    def produce(layouts, threads):
        terms = footprint(task, cuts, layouts, threads_per_worker=threads, n_workers=1)
        return float(terms.produce[0])

    one = layout("a", source_block_count=1, making_shares=(1.0,))
    two = layout("b", source_block_count=1, making_shares=(1.0,))
    assert produce([one], 2) == pytest.approx(made / 2)
    assert produce([one, two], 2) == pytest.approx(made)
    uneven = layout("c", source_block_count=4, making_shares=(1.0, 1.0, 0.5, 0.3))
    assert produce([uneven], 4) == pytest.approx((1 + 1 + 0.5 + 0.3) / 4 * made)
    # the largest of both graphs' makings, not the first listed of each
    remainders = [layout(n, source_block_count=2, making_shares=(1.0, 0.2)) for n in "de"]
    assert produce(remainders, 2) == pytest.approx(made)


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


VOLUME = ("inline", "crossline", "sample")


def _volume_cuts(length: int, halo: int) -> dict[str, DimCut]:
    """A 200^3 volume cut in chunks of ``length`` along each dim, with a halo of ``halo``."""
    n = math.ceil(200 / length)
    cut = DimCut(
        size=200,
        lengths=np.array([length]),
        n_chunks=np.array([n]),
        padded=np.array([length + (2 * halo if n > 2 else halo if n == 2 else 0)]),
        units=np.array([1]),
        halo=halo > 0,
    )
    return dict.fromkeys(VOLUME, cut)


@pytest.mark.parametrize(
    ("length", "halo", "measured"),
    [(10, 9, 235_113), (20, 9, 26_953), (40, 9, 2_823), (10, 0, 24_001)],
)
def test_the_graph_s_tasks_are_counted_at_least_as_dask_builds_them(length, halo, measured):
    """Graphs ``apply`` built for a 200^3 volume made in one Dask chunk (gst3d's halo of 9, and
    an element-wise function), counted with ``len(result.data.__dask_graph__())``."""
    layout = InputLayout("v", VOLUME, 4, InputKind.GRAPH, dict.fromkeys(VOLUME, 200))
    counted = float(graph_tasks(layout, _volume_cuts(length, halo))[0])
    assert measured <= counted <= 1.5 * measured


def test_chunks_that_are_the_source_s_add_no_rechunk_tasks():
    layout = InputLayout("v", VOLUME, 4, InputKind.GRAPH, dict.fromkeys(VOLUME, 40))
    assert graph_tasks(layout, _volume_cuts(40, 0))[0] == 2 * 5**3  # the source's, the task's
    merged = float(graph_tasks(layout, _volume_cuts(80, 0))[0])
    assert merged == 2 * 5**3 + 2 * 3**3  # the source; a piece of each; assembled; the task


def test_a_graph_in_uneven_chunks_counts_each_of_its_blocks():
    """Chunks of 40 then 10s along each dim of a 200^3 volume: 17^3 source blocks, where its
    longest chunk says 5^3. Counted, they are the graph's tasks, and the workers its records
    spread over."""
    derived = InputLayout("v", VOLUME, 4, InputKind.GRAPH, dict.fromkeys(VOLUME, 40))
    counted = InputLayout(
        "v", VOLUME, 4, InputKind.GRAPH, dict.fromkeys(VOLUME, 40), source_block_count=17**3
    )
    cuts = _volume_cuts(40, 0)
    assert graph_tasks(counted, cuts)[0] - graph_tasks(derived, cuts)[0] == 17**3 - 5**3
    records = {
        layout.source_block_count: footprint(
            np.array([0.0]), cuts, [layout], threads_per_worker=1, n_workers=200
        ).graph[0]
        for layout in (derived, counted)
    }
    # a graph's tasks follow its source blocks: 5^3 of them reach 125 of the 200 workers,
    # 17^3 all of them
    per_worker = {
        0: graph_tasks(derived, cuts)[0] / 5**3,
        17**3: graph_tasks(counted, cuts)[0] / 200,
    }
    assert records[17**3] / records[0] == pytest.approx(per_worker[17**3] / per_worker[0])


def test_a_one_chunk_stencil_in_tiny_chunks_holds_its_tasks_records_and_halo_slices():
    """1 worker x 2 threads, a 200^3 float32 volume made in one chunk, gst3d's halo of 9 in
    10^3 chunks: the worker held 1937 MiB above idle, of which about 128 MiB was the compiled
    kernel and 1 MiB the two tasks. The plan counted 61 MiB."""
    layout = InputLayout("v", VOLUME, 4, InputKind.GRAPH, dict.fromkeys(VOLUME, 200))
    terms = footprint(
        np.array([0.0]), _volume_cuts(10, 9), [layout], threads_per_worker=2, n_workers=1
    )
    per_worker = 2 * float(terms.held[0] + terms.graph[0] + terms.gather[0])
    assert per_worker >= (1937 - 128 - 1) * 2**20
    assert float(terms.graph[0]) >= 235_113 * GRAPH_TASK_BYTES / 2
    # a GPU's budget is its own memory: the records are in the host's
    on_gpu = footprint(
        np.array([0.0]),
        _volume_cuts(10, 9),
        [layout],
        threads_per_worker=2,
        n_workers=1,
        device="gpu",
    )
    assert float(on_gpu.graph[0]) == 0.0

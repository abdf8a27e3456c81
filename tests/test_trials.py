"""The randomized trials' generator and summary (benchmarks/trials.py), without running any."""

import math

import numpy as np
import pytest
from harness.trials import CHUNKINGS, OPERATORS, SOURCES, draw, stated_minimum
from trials import summary_table


def test_a_trial_is_the_same_whatever_else_was_drawn():
    assert draw(7, 41) == draw(7, 41)
    assert draw(7, 41) != draw(8, 41)
    assert [draw(7, i) for i in (3, 2, 1)][::-1] == [draw(7, i) for i in (1, 2, 3)]


def test_trials_cover_the_matrix_within_its_bounds():
    trials = [draw(2026, i) for i in range(400)]
    assert {t.op for t in trials} == set(OPERATORS)
    assert {t.chunking for t in trials} == set(CHUNKINGS)
    assert {t.n_workers for t in trials} == {1, 2, 3}
    assert {t.threads for t in trials} == {1, 2, 4}
    for t in trials:
        assert 0.5 <= t.memory_limit_gb <= 3
        assert 80e6 <= t.nbytes <= 3.1e9, t
        assert t.source in SOURCES[t.family]
        assert set(t.chunks) == set(t.shape)
        assert all(1 <= t.chunks[d] <= t.shape[d] for d in t.shape)
        assert math.prod(t.shape.values()) > 0
    sizes = np.array([t.nbytes for t in trials])
    assert np.median(sizes) < 1e9 < sizes.max()  # log-uniform: most are small, some large
    assert {t.first for t in trials} == {"dask", "memchunk"}


def test_the_least_memory_a_refusal_states():
    message = (  # a plan's refusal is led by its least, then says why
        "'svd' needs more memory: give each worker at least 797.10 MiB (memory_limit) at 2 "
        "threads per worker. Why: exact: ... give each worker at least "
        "1.28 GiB (memory_limit) at 2 threads per worker; ... Planned at that memory_limit, "
        "'svd' needs more: give each worker at least 797.10 MiB (memory_limit)"
    )
    assert stated_minimum(message) == "797.10 MiB"
    assert stated_minimum("give each task at least 68.58 MiB (Budget.per_task)") == ""


def _side(outcome="completed", pauses=0, deaths=0, peak=100e6, seconds=10.0, **extra):
    side = {
        "outcome": outcome,
        "pauses": pauses,
        "deaths": deaths,
        "peak_worker": peak,
        "seconds": seconds,
        "predicted_worker": 0,
        "error": "",
        "rerun": {},
    }
    return side | extra


@pytest.fixture
def records():
    base = draw(1, 0).__dict__ | {"nbytes": draw(1, 0).nbytes, "first": "dask"}
    return [
        base | {"dask": _side(), "memchunk": _side(peak=50e6, seconds=5.0)},
        base | {"dask": _side("killed", deaths=3), "memchunk": _side(predicted_worker=200e6)},
        base
        | {
            "dask": _side(pauses=2, seconds=40.0),
            "memchunk": _side(
                "refused", minimum_limit="1 GiB", rerun=_side() | {"memory_limit": "1.03GB"}
            ),
        },
    ]


def test_the_summary_counts_failures_ratios_and_refusals(records):
    text = summary_table(records)
    assert (
        "| failed for memory (a pause, a death, KilledWorker, MemoryError or a hang) "
        "| 2 (66.7%) | 0 (0.0%) |" in text
    )
    assert "memchunk / Dask, where both completed: median 0.50 (n=1)" in text
    assert "Dask did not pause or lose a worker: median 0.50 (n=1)" in text
    assert "refusals: 1; re-run at the stated minimum: 1 completed, 1 with 0 pauses" in text
    assert "memchunk's failures" not in text
    assert "(cautious beyond need): 0\n" in text + "\n"  # Dask paused where it was refused


def test_a_refusal_where_dask_ran_cleanly_is_named_cautious(records):
    records[2]["dask"] = _side()  # no pause, no death
    records[2]["index"] = 7
    assert "(cautious beyond need): 1 (trials 7)" in summary_table(records)


def test_a_memchunk_failure_is_named(records):
    records[0]["memchunk"]["pauses"] = 1
    assert "memchunk's failures" in summary_table(records)


def test_a_hang_counts_for_memory_only_at_the_pause_threshold(records):
    limit = records[0]["memory_limit_gb"] * 1e9
    records[0]["dask"] = _side("hung", peak=0.3 * limit)  # a graph too large to finish: slow
    records[1]["dask"] = _side("hung", peak=0.85 * limit)  # a paused worker waiting
    text = summary_table(records)
    assert "| past its time limit, every worker below the pause threshold | 1 (33.3%) |" in text
    assert "|   hung at the pause threshold past its time limit | 1 (33.3%) |" in text


def test_distributeds_memory_error_counts_for_memory_not_as_another_error(records):
    message = "MemoryError: Task ('rechunk-merge-c8', 0, 0) has 1.67 GiB worth of input"
    records[0]["dask"] = _side("error", error=message)
    records[1]["dask"] = _side("error", error="AttributeError: cannot access submodule")
    text = summary_table(records)
    assert "|   MemoryError: a task's inputs exceed memory_limit | 1 (33.3%) |" in text
    assert "| other error (not memory) | 1 (33.3%) |" in text
    assert "KilledWorker, MemoryError or a hang) | 2 (66.7%) |" in text


def test_a_trial_run_again_after_a_fix_names_its_earlier_run(records):
    earlier = records[1] | {"memchunk": _side("hung", pauses=1), "why": "held input fixed"}
    records[1] = records[1] | {"earlier": [earlier], "commit": "abc1234"}
    text = summary_table(records)
    assert "memchunk's failures" not in text  # counted as it runs now
    assert "- before: " in text and "memchunk hung" in text
    assert "  - why: held input fixed" in text
    assert "  - again at abc1234: " in text


def test_a_trial_run_again_on_memchunks_side_only_says_dasks_was_kept(records):
    earlier = records[1] | {"memchunk": _side("hung"), "why": "calibration range widened"}
    records[1] = records[1] | {"earlier": [earlier], "commit": "abc1234", "dask_kept": "f00"}
    text = summary_table(records)
    assert "  - again at abc1234 (memchunk's side only; Dask's kept): " in text


def test_again_on_memchunks_side_only_keeps_where_dasks_side_ran(records, tmp_path, monkeypatch):
    import argparse
    import json

    import trials

    path = tmp_path / "trials.jsonl"
    records[1] |= {"seed": 5, "index": 9, "commit": "aaa"}
    path.write_text(json.dumps(records[1]) + "\n")
    fresh = records[1] | {"memchunk": _side(seconds=3.0)}
    del fresh["dask"]  # memchunk's side only, as `one --side memchunk` records it
    monkeypatch.setattr(trials, "_run_in_process", lambda seed, index, env, sides: dict(fresh))
    for _ in range(2):
        args = argparse.Namespace(out=path, seed=5, index=[9], why="fixed", memchunk_only=True)
        trials.again(args)
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["dask"] == records[1]["dask"]
    assert record["dask_kept"] == "aaa"  # the commit Dask's side ran at, not the first rerun's
    assert len(record["earlier"]) == 2

"""Randomized trials at the paper's scale: Dask as users write it, against memchunk.

    python benchmarks/trials.py run --seed 2026 --stop 768       # resumable: skips done trials
    python benchmarks/trials.py run --start 100 --stop 200 --max-minutes 120
    python benchmarks/trials.py again 44 --why "..."              # after a fix: run it again
    python benchmarks/trials.py again 44 --why "..." --memchunk-only  # Dask's side kept
    python benchmarks/trials.py summary                           # the table, from the JSONL
    python benchmarks/trials.py run --seed 2027 --stop 60 --out benchmarks/results/trials_2027.jsonl

Each trial (:func:`harness.trials.draw`) is run in a process of its own, on fresh
``LocalCluster`` s, and appended as one JSON line to ``benchmarks/results/trials.jsonl``; a
trial whose process dies or overruns is recorded as such (``--out``: another JSONL, e.g. a new
seed's). ``summary`` prints the Markdown table and writes it beside the JSONL
(``trials.jsonl``: ``benchmarks/results/trials.md``). ``again`` runs trials once more after the
library changed to fix what they found: the record is replaced, and the one it replaces is
kept in its ``earlier`` list with why it was run again and the commit it ran at; the summary
names them. With ``--memchunk-only`` (a fix to memchunk, which Dask's side does not run), only
memchunk's side runs again, and the record keeps the earlier run's Dask side (``dask_kept``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xarray_memchunk.units import to_bytes

SIDES = ("dask", "memchunk")
RESULTS = Path(__file__).parent / "results"
JSONL = RESULTS / "trials.jsonl"
DEFAULT_SEED = 2026


def _done(path: Path, seed: int) -> set[int]:
    if not path.exists():
        return set()
    return {r["index"] for r in _records(path) if r["seed"] == seed}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(args: argparse.Namespace) -> None:
    """Run the trials of ``[start, stop)`` not yet in the JSONL, each in a process of its own."""
    done = _done(args.out, args.seed)
    deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else None
    with _calibrations() as env:
        for index in range(args.start, args.stop):
            if index in done:
                continue
            if deadline is not None and time.monotonic() > deadline:
                print(f"stopped at trial {index}: --max-minutes reached", flush=True)
                return
            record = _run_in_process(args.seed, index, env)
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(_line(record), flush=True)


@contextlib.contextmanager
def _calibrations() -> Iterator[dict[str, str]]:
    """The environment of a run's trial processes, whose calibration directory is the run's own.

    What the trials teach stays in this run: never in the user's own calibration directory. It
    is removed when the run ends.
    """
    with tempfile.TemporaryDirectory(prefix="memchunk-calibrations-") as directory:
        yield {**os.environ, "MEMCHUNK_CALIBRATION_DIR": directory}


def _run_in_process(
    seed: int, index: int, env: dict[str, str], sides: tuple[str, ...] = SIDES
) -> dict[str, Any]:
    """Trial ``index``, run by ``one`` in a process of its own (its ``sides``); its record."""
    from harness.trials import _timeout, draw

    trial = draw(seed, index)
    limit = 600 + 3 * _timeout(trial)  # input, both sides, a refusal's rerun
    command = [sys.executable, __file__, "one", "--seed", str(seed), str(index)]
    command += [f"--side={side}" for side in sides]
    started = time.monotonic()
    try:
        done_run = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env)
        lines = [line for line in done_run.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if lines else _crashed(trial, done_run.stderr)
    except subprocess.TimeoutExpired:
        record = _crashed(trial, f"the trial's process ran past {limit:.0f} s")
    record["trial_seconds"] = round(time.monotonic() - started, 1)
    return record


def again(args: argparse.Namespace) -> None:
    """Run trials once more after a fix; replace their records, keeping the earlier ones."""
    records = _records(args.out)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with _calibrations() as env:
        for index in args.index:
            (position,) = [
                i for i, r in enumerate(records) if r["seed"] == args.seed and r["index"] == index
            ]
            earlier = records[position]
            sides = ("memchunk",) if args.memchunk_only else SIDES
            record = _run_in_process(args.seed, index, env, sides)
            if args.memchunk_only and "crashed" not in record and "dask" in earlier:
                record["dask"] = earlier["dask"]
                # where Dask's side ran: an earlier rerun may have kept it too
                record["dask_kept"] = earlier.get("dask_kept") or earlier.get(
                    "commit", "the first run"
                )
            kept = {k: v for k, v in earlier.items() if k not in ("earlier",)}
            record["earlier"] = [*earlier.get("earlier", []), {**kept, "why": args.why}]
            record["commit"] = commit
            records[position] = record
            args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
            print(_line(record), flush=True)


def _crashed(trial: Any, why: str) -> dict[str, Any]:
    from dataclasses import asdict

    return {**asdict(trial), "nbytes": trial.nbytes, "crashed": why.strip()[-500:]}


def one(args: argparse.Namespace) -> None:
    """Run one trial here and print its record as a JSON line."""
    from harness.trials import draw, run_trial

    print(json.dumps(run_trial(draw(args.seed, args.index), args.side or SIDES)), flush=True)


def _line(r: dict[str, Any]) -> str:
    head = (
        f"[{r['index']}] {r['op']} {r['dtype']} {r['nbytes'] / 1e9:.2f} GB {r['source']}/"
        f"{r['chunking']} {r['n_workers']}x{r['threads']} @ {r['memory_limit_gb']} GB"
    )
    if "crashed" in r:
        return f"{head}: CRASHED {r['crashed'][-200:]}"
    parts = []
    for side in ("dask", "memchunk"):
        s = r[side]
        extra = f" min {s['minimum_limit']}" if s.get("minimum_limit") else ""
        if s.get("rerun"):
            extra += f" rerun {s['rerun'].get('outcome')}"
        parts.append(
            f"{side} {s['outcome']} {s['seconds']:.0f}s p{s['pauses']} d{s['deaths']} "
            f"{s['peak_worker'] / 1e6:.0f}MB{extra}"
        )
    return f"{head}: " + "; ".join(parts)


#: Dask pauses a worker above this share of its ``memory_limit``.
PAUSE_FRACTION = 0.8


def _hung_for_memory(side: dict[str, Any], limit: float) -> bool:
    """A hang with a worker at its pause threshold: waiting for memory its own task holds."""
    peak = max(side["peak_worker"], side.get("plan_peak_worker", 0))
    return side["outcome"] == "hung" and peak >= PAUSE_FRACTION * limit


def _slow(side: dict[str, Any], limit: float) -> bool:
    """Past the time limit with every worker below its pause threshold: slow, not memory."""
    return side["outcome"] == "hung" and not _hung_for_memory(side, limit)


def _refused_by_distributed(side: dict[str, Any], _: float = 0.0) -> bool:
    """distributed's ``MemoryError``: a task's inputs alone exceed a worker's ``memory_limit``.

    The scheduler raises it once the graph is running, after other tasks ran: the call a user
    wrote failed for memory, not for a bug.
    """
    return side["outcome"] == "error" and side.get("error", "").startswith("MemoryError")


def _failed(side: dict[str, Any], limit: float) -> bool:
    """A memory failure: a pause, a death, KilledWorker, distributed's ``MemoryError``, or a
    hang at the pause threshold."""
    memory = side["outcome"] == "killed" or _hung_for_memory(side, limit)
    memory = memory or _refused_by_distributed(side)
    return memory or side["pauses"] > 0 or side["deaths"] > 0


def _limit(record: dict[str, Any]) -> float:
    return record["memory_limit_gb"] * 1e9


def _pct(n: int, d: int) -> str:
    return f"{n} ({100 * n / d:.1f}%)" if d else "0"


def summary_table(records: list[dict[str, Any]]) -> str:
    """The summary: failure rates, peak and wall-time ratios, refusals, and the failures."""
    ran = [r for r in records if "crashed" not in r]
    crashed = [r for r in records if "crashed" in r]
    rows = ["| | Dask as users write it | memchunk |", "| --- | --- | --- |"]
    n = len(ran)
    for label, test in (
        ("completed", lambda s, _: s["outcome"] == "completed"),
        ("failed for memory (a pause, a death, KilledWorker, MemoryError or a hang)", _failed),
        ("  paused a worker", lambda s, _: s["pauses"] > 0),
        ("  lost a worker", lambda s, _: s["deaths"] > 0),
        ("  KilledWorker", lambda s, _: s["outcome"] == "killed"),
        ("  MemoryError: a task's inputs exceed memory_limit", _refused_by_distributed),
        ("  hung at the pause threshold past its time limit", _hung_for_memory),
        ("past its time limit, every worker below the pause threshold", _slow),
        ("refused before running", lambda s, _: s["outcome"] == "refused"),
        (
            "other error (not memory)",
            lambda s, _: s["outcome"] == "error" and not _refused_by_distributed(s),
        ),
    ):
        counts = {side: sum(test(r[side], _limit(r)) for r in ran) for side in SIDES}
        rows.append(f"| {label} | {_pct(counts['dask'], n)} | {_pct(counts['memchunk'], n)} |")
    both = [r for r in ran if all(r[s]["outcome"] == "completed" for s in ("dask", "memchunk"))]
    peak = [r["memchunk"]["peak_worker"] / r["dask"]["peak_worker"] for r in both]
    clean = [r for r in both if not _failed(r["dask"], _limit(r))]
    wall = [r["memchunk"]["seconds"] / r["dask"]["seconds"] for r in clean if r["dask"]["seconds"]]
    predicted = [
        r["memchunk"]["peak_worker"] / r["memchunk"]["predicted_worker"]
        for r in ran
        if r["memchunk"]["outcome"] == "completed" and r["memchunk"]["predicted_worker"]
    ]
    refused = [r for r in ran if r["memchunk"]["outcome"] == "refused"]
    rerun_ok = [r for r in refused if r["memchunk"]["rerun"].get("outcome") == "completed"]
    rerun_safe = [
        r
        for r in rerun_ok
        if not _failed(r["memchunk"]["rerun"], to_bytes(r["memchunk"]["rerun"]["memory_limit"]))
    ]

    # a refusal where Dask completed with no pause and no death: cautious beyond need
    cautious = [
        r
        for r in refused
        if r["dask"]["outcome"] == "completed" and not _failed(r["dask"], _limit(r))
    ]

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} (n={len(values)})" if values else "n/a"

    lines = [
        f"{len(records)} trials ({n} ran, {len(crashed)} whose process crashed or overran).",
        "",
        *rows,
        "",
        f"- peak worker memory, memchunk / Dask, where both completed: median {med(peak)}",
        f"- wall time, memchunk / Dask, where both completed and Dask did not pause or lose a "
        f"worker: median {med(wall)}",
        f"- memchunk's measured / predicted worker peak: median {med(predicted)}, largest "
        + (f"{max(predicted):.2f}" if predicted else "n/a"),
        f"- memchunk's refusals: {len(refused)}; re-run at the stated minimum: "
        f"{len(rerun_ok)} completed, {len(rerun_safe)} with 0 pauses and 0 deaths",
        f"- refusals where Dask completed with no pause and no death (cautious beyond need): "
        f"{len(cautious)}"
        + (f" (trials {', '.join(str(r['index']) for r in cautious)})" if cautious else ""),
    ]
    failures = [
        r
        for r in ran
        if _failed(r["memchunk"], _limit(r)) or r["memchunk"]["outcome"] in ("error", "hung")
    ]
    if failures or crashed:
        lines += ["", "memchunk's failures (and crashed trials), by case:", ""]
        lines += [f"- {_line(r)}; {r['memchunk'].get('error', '')[:200]}" for r in failures]
        lines += [f"- {_line(r)}" for r in crashed]
    rerun = [r for r in records if r.get("earlier")]
    if rerun:
        lines += ["", "Run again after a fix (the earlier runs, then this one):", ""]
        for r in rerun:
            for before in r["earlier"]:
                lines.append(f"- before: {_line(before)}")
                lines.append(f"  - why: {before['why']}")
            only = " (memchunk's side only; Dask's kept)" if r.get("dask_kept") else ""
            lines.append(f"  - again at {r.get('commit', '?')}{only}: {_line(r)}")
    by_op = Counter(r["op"] for r in ran)
    lines += ["", "Trials per operator: " + ", ".join(f"{k} {v}" for k, v in sorted(by_op.items()))]
    return "\n".join(lines)


def summary(args: argparse.Namespace) -> None:
    """Print the summary of the JSONL and write it beside it (``trials.jsonl``: ``trials.md``)."""
    records = _records(args.out)
    seeds = sorted({r["seed"] for r in records})
    header = (
        f"Summarised {datetime.date.today()} on {platform.node() or 'this machine'} "
        f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}) "
        f"from `{args.out.name}`: seed(s) {seeds}, trials drawn by `harness.trials.draw`, run "
        f"with `python benchmarks/trials.py run --seed <seed> --stop <n>"
        + ("`." if args.out.resolve() == JSONL.resolve() else f" --out {args.out}`.")
    )
    text = header + "\n\n" + summary_table(records) + "\n"
    print(text)
    args.out.with_suffix(".md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run trials, appending to the JSONL")
    run_parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    run_parser.add_argument("--start", type=int, default=0)
    run_parser.add_argument("--stop", type=int, default=768)
    run_parser.add_argument("--max-minutes", type=float, help="start no trial after this")
    one_parser = commands.add_parser("one", help="run one trial, print its JSON line")
    one_parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    one_parser.add_argument("index", type=int)
    one_parser.add_argument("--side", action="append", choices=SIDES, help="only this side")
    again_parser = commands.add_parser("again", help="after a fix: run trials again")
    again_parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    again_parser.add_argument("--why", required=True, help="what was fixed")
    again_parser.add_argument("index", type=int, nargs="+")
    again_parser.add_argument(
        "--memchunk-only", action="store_true", help="run memchunk's side; keep Dask's"
    )
    commands.add_parser("summary", help="print the summary table, write it beside the JSONL")
    for sub in commands.choices.values():
        sub.add_argument("--out", type=Path, default=JSONL, help="the JSONL of trials")
    args = parser.parse_args()
    {"run": run, "one": one, "again": again, "summary": summary}[args.command](args)


if __name__ == "__main__":
    main()

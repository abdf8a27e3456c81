"""Render the saved GST3D experiment results (``benchmarks/results/*.json``) as Markdown.

    python benchmarks/report.py > docs/_gst3d_results.md

The docs include that file, so every number there comes from a run of
``benchmarks/gst3d_experiment.py`` whose JSON sits beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def render(path: Path) -> str:
    record = json.loads(path.read_text())
    shape = "x".join(map(str, record["shape"]))
    lines = [
        f"## {shape} {record['dtype']}, {record['workers']} workers x {record['threads']} "
        f"thread x {record['memory_limit']} ({record['date']})",
        "",
        "| case | chunks | tasks | outcome | wall s (median of runs) | peak RSS per worker "
        "| pauses | deaths | predicted peak per task |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in record["cases"]:
        chunks = "x".join(str(v) for v in case["chunks"].values())
        outcome = "completed" if case["completed"] else case["error"].split(":")[0]
        lines.append(
            f"| {case['label']} | {chunks} | {case['tasks']} | {outcome} | {case['seconds']:.2f} "
            f"| {_mib(case['peak_worker_bytes'])} | {case['pauses']} | {case['deaths']} "
            f"| {_mib(case['predicted_peak'])} |"
        )
    manual = [c for c in record["cases"] if c["label"].startswith("manual") and c["completed"]]
    memchunk = next(c for c in record["cases"] if c["label"] == "memchunk")
    if manual and memchunk["completed"]:
        best = min(manual, key=lambda c: c["seconds"])
        lines += [
            "",
            f"memchunk / best manual ({best['label']}): "
            f"{memchunk['seconds'] / best['seconds']:.2f}",
        ]
    return "\n".join(lines)


def main() -> None:
    paths = sorted(
        RESULTS.glob("gst3d_*.json"), key=lambda p: (json.loads(p.read_text())["shape"][0], p.name)
    )
    print("\n\n".join(render(p) for p in paths))


if __name__ == "__main__":
    main()

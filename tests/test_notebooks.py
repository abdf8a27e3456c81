"""The tutorial notebooks leave nothing behind on the machine they run on.

They run at training days, many times on one machine, and in every test run (nbmake) and docs
build: each run writes its data (up to 272 MB) into a temporary directory of its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_removes_the_directory_it_made(path: Path) -> None:
    cells = _code_cells(path)
    made = [m.group(1) for cell in cells for m in re.finditer(r"(\w+) = .*mkdtemp\(", cell)]
    for name in made:
        assert f"shutil.rmtree({name})" in cells[-1], (
            f"{path.name} makes {name} with tempfile.mkdtemp but its last code cell does not "
            f"remove it (shutil.rmtree({name}))"
        )

"""The package's modules import downwards only, in no cycle; planning/ is pure.

Every ``.py`` file of the package is read with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` included, relative imports resolved): its module imports no module of a
higher layer of :data:`LAYERS`, the imports form no cycle, and ``planning/`` imports no xarray,
distributed or CuPy.
"""

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "xarray_memchunk"
ROOT = PACKAGE.name
#: What modules of each layer may import from the package (relative imports, resolved).
ALLOWED = {
    "planning": {"planning", "errors", "units"},
    "models": {"models", "errors"},
    "operators": {
        "operators",
        "planning",
        "models",
        "errors",
        "units",
        "clusters",
        "_dask_compat",
    },
}
FORBIDDEN_IN_PLANNING = {"xarray", "distributed", "cupy", "cf_xarray", "zarr", "netCDF4"}

#: The package's top-level modules and subpackages, lowest first: each imports only from its
#: own layer and those below. ``__init__`` is the package itself, which imports the API it
#: exposes; only the command line, above it, imports the package whole.
LAYERS = (
    ("_version", "errors", "units", "worker_preload"),
    ("planning",),
    ("models",),
    ("_dask_compat", "clusters"),
    ("operators",),
    ("measure",),
    ("memory_limits", "io", "seismic"),
    ("baselines", "refusals", "gathering"),
    ("api",),
    ("accessor", "datasets", "demo", "interrupts", "testing"),
    ("__init__",),
    ("cli",),
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, relative level) of every import in the file, function bodies included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def package_part(path: Path, module: str, level: int) -> str | None:
    """The top-level part of xarray_memchunk a relative import reaches, or None."""
    if level == 0:
        parts = module.split(".")
        return parts[1] if parts[0] == "xarray_memchunk" and len(parts) > 1 else None
    here = path.relative_to(PACKAGE).parts[:-1]
    base = here[: len(here) - (level - 1)]
    target = [*base, *(module.split(".") if module else [])]
    return target[0] if target else None


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_downwards_only(layer):
    for path in sorted((PACKAGE / layer).glob("*.py")):
        for module, level in imports(path):
            part = package_part(path, module, level)
            if part is not None:
                assert part.removesuffix(".py") in ALLOWED[layer], (path.name, module, level)


def test_planning_imports_no_xarray_distributed_or_cupy():
    for path in sorted((PACKAGE / "planning").glob("*.py")):
        for module, level in imports(path):
            if level == 0:
                assert module.split(".")[0] not in FORBIDDEN_IN_PLANNING, (path.name, module)


# --- the whole package: module graph, layers, cycles ------------------------------------------


def _module_name(path: Path) -> str:
    """``xarray_memchunk.operators.sources`` for its file; a package's name for its __init__."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _package_of(module: str) -> str:
    """The package whose namespace a module's relative imports start from."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _ancestors(module: str) -> list[str]:
    """The packages whose ``__init__`` importing ``module`` runs first, outermost first."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The package's modules one import statement of ``module`` names (not its parents)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == ROOT)
        return
    if node.level:
        base = _package_of(module).split(".")
        base = base[: len(base) - (node.level - 1)]
        named = ".".join([*base, *([node.module] if node.module else [])])
    else:
        named = node.module or ""
    if named.split(".")[0] != ROOT:
        return
    for alias in node.names:  # ``from . import x`` imports the submodule x, where there is one
        submodule = f"{named}.{alias.name}"
        yield submodule if submodule in MODULES else named


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` of the whole package.

    An import runs, besides the module it names, the ``__init__`` of each package around that
    module that is not already around the importer (those are being imported already): those
    are edges too.
    """
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for module, path in MODULES.items():
        around = {*_ancestors(module), module}
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(module, node):
                if target not in MODULES:
                    raise AssertionError(f"{path}:{node.lineno} imports {target}, not found")
                runs_first = [a for a in _ancestors(target) if a not in around]
                for reached in [*runs_first, target]:
                    if reached != module:
                        graph[module].setdefault(reached, node.lineno)
    return graph


def _where(module: str, target: str, graph: dict[str, dict[str, int]]) -> str:
    path = MODULES[module].relative_to(PACKAGE.parent)
    return f"{module} -> {target} ({path}:{graph[module][target]})"


def _layer(module: str) -> str:
    """The part of :data:`LAYERS` a module belongs to: its top-level name under the package."""
    if module == ROOT:
        return "__init__"
    return module.split(".")[1]


def test_every_module_has_a_layer():
    missing = sorted({_layer(m) for m in MODULES} - set(RANK))
    assert not missing, f"modules of no layer (add them to LAYERS): {missing}"


def test_nothing_imports_upward():
    graph = import_graph()
    upward = [
        _where(module, target, graph)
        for module, targets in graph.items()
        for target in targets
        if module != ROOT and RANK[_layer(target)] > RANK[_layer(module)]
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def _cycle_through(start: str, graph: dict[str, dict[str, int]]) -> list[str] | None:
    """The shortest chain of imports from ``start`` back to it, or None."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop(0)
        for target in sorted(graph[current]):
            if target == start:
                return [*paths[current], start]
            if target not in paths:
                paths[target] = [*paths[current], target]
                todo.append(target)
    return None


def test_no_import_cycles():
    graph = import_graph()
    cycles, seen = [], set()
    for module in sorted(graph):
        cycle = _cycle_through(module, graph)
        if cycle is not None and not seen & set(cycle):
            seen |= set(cycle)
            cycles.append("\n  ".join(_where(a, b, graph) for a, b in pairwise(cycle)))
    assert not cycles, "import cycles:\n  " + "\n\n  ".join(cycles)


def test_runs_imports_task_peaks_lazily_and_task_peaks_not_runs():
    """``measure/runs.py`` reaches the worker plugin (and distributed) only where it needs it."""
    graph = import_graph()
    runs, peaks = f"{ROOT}.measure.runs", f"{ROOT}.measure.task_peaks"
    assert peaks in graph[runs]
    assert _cycle_through(runs, graph) is None
    top_level = [
        node
        for node in ast.parse(MODULES[runs].read_text()).body
        if isinstance(node, ast.ImportFrom) and node.level and node.module == "task_peaks"
    ]
    assert not top_level, "runs.py imports task_peaks (and so distributed) at import time"


def test_the_graph_resolves_relative_imports():
    graph = import_graph()
    assert f"{ROOT}._dask_compat" in graph[f"{ROOT}.operators.svd.tsqr"]
    assert f"{ROOT}.operators.sources" in graph[f"{ROOT}.operators.gst3d.operator"]
    # importing a module of another package runs that package's __init__ first
    assert f"{ROOT}.models" in graph[f"{ROOT}.measure.runs"]
    assert f"{ROOT}.operators" not in graph[f"{ROOT}.operators.sources"]

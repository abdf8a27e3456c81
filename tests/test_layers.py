"""The layers import downwards only: planning/ is pure (no xarray, distributed, cupy)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "xarray_memchunk"
#: What modules of each layer may import from the package (relative imports, resolved).
ALLOWED = {
    "planning": {"planning", "errors", "units"},
    "models": {"models", "errors"},
    "operators": {"operators", "planning", "models", "errors", "units", "clusters"},
}
FORBIDDEN_IN_PLANNING = {"xarray", "distributed", "cupy", "cf_xarray", "zarr", "netCDF4"}


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

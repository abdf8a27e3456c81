"""Sphinx configuration: MyST pages, executed tutorial notebooks, accessor API reference."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import sphinx_autosummary_accessors

import xarray_memchunk

HERE = Path(__file__).parent
ROOT = HERE.parent

project = "xarray-memchunk"
author = "xarray-memchunk developers"
copyright = "2026, xarray-memchunk developers"
release = version = xarray_memchunk.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_autosummary_accessors",
]
templates_path = ["_templates", sphinx_autosummary_accessors.templates_path]
exclude_patterns = ["_build", "_*.md", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
html_theme = "pydata_sphinx_theme"
html_title = "xarray-memchunk"

autosummary_generate = True
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3  # links to sections: benchmarks.md#staging-on-disk
suppress_warnings = ["mystnb.unknown_mime_type"]

# Tutorials: the notebooks in notebooks/ are copied here and executed at the small size.
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True  # a failing cell prints its traceback in the build log
os.environ.setdefault("MEMCHUNK_NOTEBOOK_SIZE", "small")
# What the notebooks measure and learn goes to a directory removed after the build, not to the
# user's own calibrations (which would also make a second build plan differently from the first),
# unless MEMCHUNK_CALIBRATION_DIR is set already.
_CALIBRATIONS = tempfile.mkdtemp(prefix="memchunk-docs-calibrations-")
os.environ.setdefault("MEMCHUNK_CALIBRATION_DIR", _CALIBRATIONS)
atexit.register(shutil.rmtree, _CALIBRATIONS, ignore_errors=True)
tutorials = HERE / "tutorials"
tutorials.mkdir(exist_ok=True)
for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    shutil.copy2(notebook, tutorials / notebook.name)

# CLI reference: the parser's own help, so the page never drifts from the code.
sys.path.insert(0, str(ROOT))
from xarray_memchunk.cli import _build_parser  # noqa: E402

generated = HERE / "_generated"
generated.mkdir(exist_ok=True)
parser = _build_parser()
subparsers = parser._subparsers._group_actions[0].choices
with open(generated / "cli.txt", "w") as f:
    f.write(parser.format_help())
    for name, sub in subparsers.items():
        f.write(f"\n\n$ memchunk {name} --help\n")
        f.write(sub.format_help())

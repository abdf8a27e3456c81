"""Test-run settings, for the tests and the tutorial notebooks (``pytest notebooks``) alike.

- The notebooks run at their small size.
- User calibrations (self-calibration, learning from runs) go to a temporary directory, never
  to the user's own: set in the environment, so that the notebook kernels and the command
  line's subprocesses inherit it. Each test module gets a directory of its own (pytest's
  temporary directories, which it prunes itself): what one module's runs teach (a model raised
  x2) would change the plans of another that happens to run after it in the same process.
  The run's own directory, for what runs outside a module, is removed when the run ends.
"""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("MEMCHUNK_NOTEBOOK_SIZE", "small")
_CALIBRATIONS = tempfile.mkdtemp(prefix="memchunk-test-calibrations-")
os.environ["MEMCHUNK_CALIBRATION_DIR"] = _CALIBRATIONS
atexit.register(shutil.rmtree, _CALIBRATIONS, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def calibrations_of_this_module(tmp_path_factory):
    """A calibration directory for the module's tests alone (see the module docstring)."""
    path = tmp_path_factory.mktemp("calibrations")
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = str(path)
    yield path
    os.environ["MEMCHUNK_CALIBRATION_DIR"] = _CALIBRATIONS

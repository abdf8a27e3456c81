"""Test-run settings, for the tests and the tutorial notebooks (``pytest notebooks``) alike.

- The notebooks run at their small size.
- User calibrations (self-calibration, learning from runs) go to a temporary directory, never
  to the user's own: set in the environment, so that the notebook kernels and the command
  line's subprocesses inherit it. It is removed when the test run ends.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("MEMCHUNK_NOTEBOOK_SIZE", "small")
_CALIBRATIONS = tempfile.mkdtemp(prefix="memchunk-test-calibrations-")
os.environ["MEMCHUNK_CALIBRATION_DIR"] = _CALIBRATIONS
atexit.register(shutil.rmtree, _CALIBRATIONS, ignore_errors=True)

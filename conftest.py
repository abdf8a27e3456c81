"""Test-run settings, for the tests and the tutorial notebooks (collected by nbmake) alike.

- The notebooks run at their small size.
- User calibrations (self-calibration, learning from runs) go to a temporary directory, never
  to the user's own: set in the environment, so that the notebook kernels and the command
  line's subprocesses inherit it.
"""

import os
import tempfile

os.environ.setdefault("MEMCHUNK_NOTEBOOK_SIZE", "small")
os.environ["MEMCHUNK_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="memchunk-test-calibrations-")

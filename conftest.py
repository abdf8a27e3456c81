"""Run the tutorial notebooks (collected by nbmake) at their small size."""

import os

os.environ.setdefault("MEMCHUNK_NOTEBOOK_SIZE", "small")

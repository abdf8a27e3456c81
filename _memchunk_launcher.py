"""The ``memchunk`` command's entry point: interrupts are handled before the library loads.

Importing xarray, Dask and the package takes a second or two; a SIGTERM or Ctrl-C then would end
the command with no word (status -15) instead of the one line it gives at any later moment.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Say so in one line and end the process at once, with status 128 + the signal.

    Not by raising ``SystemExit``: the signal lands inside an import, where a library's bare
    ``except:`` may catch it and the command would go on (it once ended with status 0 so).
    Nothing was written yet, so nothing is left to clean up.
    """
    name = signal.Signals(signum).name
    line = f"memchunk: interrupted by {name} while starting: nothing was written\n"
    os.write(2, line.encode())
    os._exit(128 + signum)


def main() -> int:
    """Handle interrupts, then run :func:`xarray_memchunk.cli.main` (which takes them over)."""
    for interrupt in (signal.SIGINT, signal.SIGTERM):
        signal.signal(interrupt, _interrupted_while_starting)
    from xarray_memchunk.cli import main as run
    from xarray_memchunk.interrupts import INTERRUPTS

    status = run(exiting=True)
    for interrupt in INTERRUPTS:  # done: an interrupt now would only cut the exit short
        signal.signal(interrupt, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(main())

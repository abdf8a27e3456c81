"""The ``memchunk`` command's entry point: interrupts are handled before the library loads.

Importing xarray, Dask and the package takes a second or two; a SIGTERM or Ctrl-C then would end
the command with no word (status -15) instead of the one line it gives at any later moment.
"""

from __future__ import annotations

import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    sys.stderr.write(f"memchunk: interrupted by {name} while starting: nothing was written\n")
    raise SystemExit(128 + signum)


def main() -> int:
    """Handle interrupts, then run :func:`xarray_memchunk.cli.main` (which takes them over)."""
    for interrupt in (signal.SIGINT, signal.SIGTERM):
        signal.signal(interrupt, _interrupted_while_starting)
    from xarray_memchunk.cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())

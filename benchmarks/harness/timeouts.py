"""A time limit on work that waits for a cluster: a paused worker can wait for ever."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["within"]


def within(timeout: float, work: Callable[[], None]) -> None:
    """Run ``work`` in a thread; raise ``TimeoutError`` when it has not returned in time.

    The thread is left waiting on its computation, which fails when the caller closes the
    workers it waits on.
    """
    errors: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"hung: no result after {timeout:.0f} s")
    if errors:
        raise errors[0]

"""A fresh ``LocalCluster`` per run, quiet, as the benchmarks start one for each measurement."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from distributed import Client, LocalCluster


@contextlib.contextmanager
def fresh_client(n_workers: int, threads: int, memory_limit: str | None) -> Iterator[Client]:
    """A client of a new ``LocalCluster`` (worker processes), its logs and warnings silenced."""
    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads,
            memory_limit=memory_limit,
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        ) as cluster,
        Client(cluster) as client,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield client

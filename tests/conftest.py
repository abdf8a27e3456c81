import logging

import dask
import pytest

# A plan given memory_limit= with no cluster is for the process Dask's threaded scheduler
# computes in, shared by its threads (dask config num_workers, else one per CPU): one here, so
# that a test's budget does not depend on the machine's CPUs. Tests of the default set it.
dask.config.set({"num_workers": 1})


class BlockCounter:
    """A ``map_blocks`` function that passes blocks through and records their shapes.

    Dask's meta inference (an empty block) is not recorded.
    """

    def __init__(self):
        self.shapes = []

    def __call__(self, block):
        if block.size:
            self.shapes.append(block.shape)
        return block


@pytest.fixture(autouse=True)
def _no_process_memory_in_threaded_budgets(monkeypatch):
    """A plan with no cluster counts what this process holds in its baseline; a test process
    holds what earlier tests left, so that it would depend on their order. Tests of it patch
    ``this_process_memory`` again."""
    from xarray_memchunk import memory_limits

    monkeypatch.setattr(memory_limits, "this_process_memory", lambda: 0)


@pytest.fixture
def produced():
    """Counts the blocks a graph produces: ``array.map_blocks(produced)``, then ``.shapes``."""
    return BlockCounter()


@pytest.fixture
def threaded():
    """Compute with the threaded scheduler, whatever client a previous test left."""
    with dask.config.set(scheduler="threads"):
        yield


@pytest.fixture
def quiet_distributed():
    """Silence the restart warnings of workers a test kills on purpose."""
    loggers = [
        logging.getLogger(n)
        for n in (
            "distributed.nanny",
            "distributed.scheduler",
            "distributed.worker",
            "distributed.core",
        )
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@pytest.fixture
def cluster_client(quiet_distributed):
    """``(make, Client)``: ``make(memory_limit)`` is a LocalCluster of worker processes, 2 x 1
    thread unless ``n_workers`` and ``threads_per_worker`` say otherwise."""
    from distributed import Client, LocalCluster

    def make(memory_limit, n_workers=2, threads_per_worker=1):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            memory_limit=memory_limit,
            processes=True,
            dashboard_address=":0",
        )

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        yield make, Client

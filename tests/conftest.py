import logging

import dask
import pytest


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

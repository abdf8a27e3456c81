"""What producing the input costs: one block of the input's own graph, measured.

Data produced by a Dask graph (``standard_normal(...).astype("float32")``, anomalies, a unit
conversion) is produced in the workers, block by block, beside the operator's tasks: a float32
block made from a float64 one holds three times its bytes while it is made. The operator's
memory model knows nothing of that graph. So before planning, one block of the input is
computed in this process (the synchronous scheduler, as a worker's thread would) and its peak
measured (:func:`~xarray_memchunk.models.profiling.measure_peak`); what it holds beyond the
block is the plan's *producing its input* term (:mod:`~xarray_memchunk.planning.footprint`).

Graphs of one layer (data cut from a NumPy array, a random generator) produce a block in place
and are not measured. Results are cached per graph (its name), so planning the same data again
measures nothing. The dask config key ``memchunk.measure-input`` (True) turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xarray as xr

from .._dask_compat import graph_layers

__all__ = ["InputProduction", "input_production"]

_CACHE: dict[str, InputProduction] = {}


@dataclass(frozen=True)
class InputProduction:
    """What producing one block of a variable's input measured.

    Attributes
    ----------
    block_bytes
        The block's own bytes.
    extra_bytes
        What producing it held beyond the block (the term the plan adds).
    seconds
        How long producing it took.
    """

    block_bytes: int
    extra_bytes: int
    seconds: float

    def explain(self, size: Any = str) -> str:
        """One line for the plan's notes."""
        return (
            f"producing one block of the input ({size(self.block_bytes)}) was measured now, in "
            f"this process: it holds {size(self.extra_bytes)} more while it is made "
            f"({self.seconds:.2f} s); each task slot (a worker thread: it runs one task at a time) "
            f"keeps room for it"
        )


def _layers(data: Any) -> int:
    return len(graph_layers(data))


def _compute(block: Any) -> None:
    block.compute(scheduler="synchronous")


def input_production(da: xr.DataArray) -> InputProduction | None:
    """Measure (once per graph) what producing a block of ``da``'s Dask graph holds.

    Returns None for data not produced by a multi-layer graph, when measuring is turned off,
    and where the block cannot be computed here (data persisted on a cluster: its blocks live in
    the workers).
    """
    import dask

    from ..models.profiling import measure_peak

    data = da.data
    if not dask.config.get("memchunk.measure-input", True):
        return None
    if not (hasattr(data, "dask") and hasattr(data, "numblocks")) or data.ndim == 0:
        return None
    if _layers(data) <= 1:
        return None
    name = str(data.name)
    if name not in _CACHE:
        block = data.blocks[tuple(n // 2 for n in data.numblocks)]
        block_bytes = int(block.nbytes)
        try:
            peak, seconds, _ = measure_peak(_compute, block)
        except Exception:  # e.g. persisted keys that only the cluster's workers hold
            return None
        _CACHE[name] = InputProduction(block_bytes, max(0, peak - block_bytes), seconds)
    return _CACHE[name]

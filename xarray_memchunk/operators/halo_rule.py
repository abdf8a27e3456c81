"""The halo rule for data read straight from a file, checked on the lazy result before it runs.

A variable read straight from a file (:attr:`~xarray_memchunk.planning.footprint.InputKind.FILE`)
is planned as if each task read its own block, halo included, from the file itself
(:func:`~xarray_memchunk.operators.sources.map_blocks_with_halo`): no worker holds chunks for
other tasks, and the plan counts none. An operator whose :meth:`~.base.Operator.compute` gathers
the halos inside the graph instead (``dask.array.map_overlap``, ``dask.array.overlap``,
xarray's ``.rolling()``) makes every worker hold neighbour chunks until the tasks that take
their halos run: measured at 35-58% of the whole array on one worker
(:mod:`~xarray_memchunk.planning.footprint`). Its plan would then be too small, silently: the
first workers to pause would say so.

:func:`check_halo_reads` reads the lazy result's graph (layer names only: nothing is computed
or materialized) and raises a :class:`~xarray_memchunk.MemchunkError` where such a layer takes
the data of a file-read variable along a halo dim split into several chunks.

It raises rather than warns: the plan is known to be wrong (a worker would hold what the plan
says it never holds), and a plan that says it fits must not pause a worker. The check only
fires on Dask's own neighbour-gathering layers downstream of the file's data
(:func:`~xarray_memchunk._dask_compat.neighbour_gathering_layers`), which an operator that
follows the rule never makes, so it stops no correct operator; and it runs before anything is
computed, so it costs nothing but the rewrite it asks for.
"""

from __future__ import annotations

from collections.abc import Mapping

import xarray as xr

from .._dask_compat import graph_layers, neighbour_gathering_layers
from ..errors import MemchunkError
from ..planning.problem import DimRole, DimUse, halo_sides
from .sources import file_backend

__all__ = ["check_halo_reads", "split_halo_dims"]


def split_halo_dims(da: xr.DataArray, uses: Mapping[str, DimUse]) -> list[str]:
    """The dims of ``da`` the operator uses with a halo and that are split into several chunks.

    A halo dim in one chunk has no neighbour to gather (``map_blocks_with_halo`` drops its
    halo), so only split ones count.

    Parameters
    ----------
    da
        A planned variable, chunked as planned.
    uses
        How the operator uses its dims.

    Returns
    -------
    list of str
        Those dims, in ``da``'s order; empty for NumPy data.
    """
    if da.chunks is None:
        return []
    found = []
    for dim, chunks in zip(da.dims, da.chunks, strict=True):
        use = uses.get(str(dim))
        stencil = use is not None and use.role is DimRole.HALO and any(halo_sides(use.depth))
        if stencil and len(chunks) > 1:
            found.append(str(dim))
    return found


def check_halo_reads(
    result: xr.DataArray | xr.Dataset,
    planned: xr.DataArray | xr.Dataset,
    uses: Mapping[str, Mapping[str, DimUse]],
    operator: str,
) -> None:
    """Check that ``result`` reads the halos of file data from the file, not from neighbours.

    Parameters
    ----------
    result
        What the operator's ``compute`` (or ``compute_dataset``) returned: a lazy result.
    planned
        What it was given: the input chunked as planned (a DataArray, or a Dataset whose
        planned variables are the keys of ``uses``).
    uses
        How the operator uses the dims of each planned variable, by variable name (one entry,
        whatever its name, for a DataArray).
    operator
        The operator's name, for the message.

    Raises
    ------
    MemchunkError
        Where a layer of ``result`` gathers neighbour blocks of a variable read straight from a
        file, along a dim the operator uses with a halo (split into several chunks): the plan
        assumed each task reads its own block and halo from the file.
    """
    if isinstance(planned, xr.DataArray):
        variables = [(planned.name, planned, own) for own in uses.values()]
    else:
        variables = [(name, planned[name], own) for name, own in uses.items()]
    for name, da, own in variables:
        dims = split_halo_dims(da, own)
        if not dims or file_backend(da.data) is None:
            continue
        gathering = neighbour_gathering_layers(result, graph_layers(da.data))
        if gathering:
            label = f"variable {name!r}" if name is not None else "the data"
            raise MemchunkError(
                f"operator {operator!r} gathers neighbour chunks of {label}, read straight "
                f"from a file, inside its graph ({', '.join(gathering)}) along halo dim(s) "
                f"{', '.join(map(repr, dims))}: the plan assumed each task reads its own "
                f"block and halo from the file, and holds no chunk for other tasks, so the "
                f"workers would hold more than planned. Read the halos with "
                f"xarray_memchunk.operators.sources.map_blocks_with_halo (as the built-in "
                f"operators and BlockwiseOperator(depth=...) do) instead of map_overlap, "
                f"overlap or .rolling()"
            )

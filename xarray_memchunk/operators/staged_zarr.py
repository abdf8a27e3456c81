"""The Zarr store a staged result reads from: one that fails once the store is removed.

Zarr reads a chunk that has no file as the array's fill value, and an array already opened
keeps its metadata: a staged result computed after its store was removed
(:func:`~xarray_memchunk.operators.staged_stores.remove_staged_stores`) gave all-NaN floats and
all-zero integers, with no error. A staged result reads through :class:`StagedStore`, which
raises where the store's directory is gone, or a chunk's file (every chunk of a staged store
is written, fill values too). Imported by staging only (zarr's import costs
~0.2 s); zarr 2 has no such store, and its staged results read as before.
"""

from __future__ import annotations

from typing import Any

from zarr.storage import LocalStore

from ..errors import MemchunkError

__all__ = ["StagedStore"]


class StagedStore(LocalStore):
    """A read-only local Zarr store whose reads fail once its directory is removed."""

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        """The value of ``key``, as :class:`zarr.storage.LocalStore` gives it.

        Raises
        ------
        MemchunkError
            Where the store's directory no longer exists.
        """
        if not self.root.is_dir():
            raise MemchunkError(
                f"the staged data this result reads ({self.root}) was removed "
                f"(xarray_memchunk.remove_staged_stores(), or the staging directory cleaned): "
                f"apply the operator again to stage it again"
            )
        value = await super().get(key, *args, **kwargs)
        if value is None and "/c/" in f"/{key}":  # every chunk was written: this one is gone
            raise MemchunkError(
                f"the staged data this result reads lost its chunk file {self.root / key} "
                f"(the staging directory cleaned): apply the operator again to stage it again"
            )
        return value

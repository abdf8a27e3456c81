"""Which process owns a staged store, and removing the stores their process left behind.

A staged store (:func:`~xarray_memchunk.operators.staging.stage`) is removed when the Python
process that wrote it exits. A process that is killed (a SIGTERM from ``timeout`` or a batch
scheduler, a Jupyter kernel restarted, SIGKILL for memory) runs no exit handlers, and its store
stays on the staging disk: 2.4 GB per staged plan of ``benchmarks/peers.py``'s cube. On this
project's machine 17 of them (37.2 GiB) gathered in a day of benchmark runs ended by
``timeout``, until Dask's P2P rechunk ran out of disk beside them.

So each store gets an owner file beside it, written before the store (JSON: the host name,
on Linux the boot's id and the pid namespace, the process id and the process's start, in
clock ticks after boot on Linux). Staging looks, before it weighs the disk's free space, for
stores whose owner ran on this machine and namespace and is gone (no such process, a zombie,
or another process under the same id), and removes them. A store of another machine or
namespace (a shared staging directory), of a process still running, or without a readable
owner file (written by an older version) is left alone.

A process keeps its stores until it exits: each staged ``apply`` writes one, and its result
reads from it whenever it is computed. 12 of them gathered in one run of
``benchmarks/peers.py`` (the disk's free space fell from 61 to 44 GB).
:func:`remove_staged_stores` removes them earlier, once the results are computed or persisted.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import threading
from pathlib import Path

__all__ = [
    "STORE_PREFIX",
    "claim",
    "owner_file",
    "release",
    "remove_orphans",
    "remove_staged_stores",
    "staged_bytes",
]

#: How staged stores are named in the staging directory: ``<prefix><12 hex digits>.zarr``.
STORE_PREFIX = "memchunk-staged-"
#: The owner file's name beside its store: ``<store name><suffix>``.
OWNER_SUFFIX = ".owner.json"


def owner_file(store: Path) -> Path:
    """The owner file of ``store``: beside it, named after it."""
    return store.with_name(store.name + OWNER_SUFFIX)


def _machine() -> dict[str, object]:
    """What tells this machine and its process namespace apart from others sharing a directory.

    The host name and, on Linux, the boot's id and this process's pid namespace: containers
    sharing a host name and a staging directory number their processes apart.
    """
    machine: dict[str, object] = {"host": socket.gethostname()}
    with contextlib.suppress(OSError):
        machine["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        machine["pid_namespace"] = os.stat("/proc/self/ns/pid").st_ino
    return machine


def _linux_start(pid: int) -> tuple[int, bool] | None:
    """A Linux process's start, and whether it has ended unreaped (a zombie).

    The start is in clock ticks after boot, which no change of the clock moves. None where
    ``/proc`` does not list the process.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold ")"
    return int(fields[19]), fields[0] == "Z"


def _this_process() -> dict[str, object]:
    import psutil

    owner = _machine() | {"pid": os.getpid(), "started": psutil.Process().create_time()}
    linux = _linux_start(os.getpid()) if "boot_id" in owner else None
    if linux is not None:
        owner["start_ticks"] = linux[0]
    return owner


#: The stores this process claimed and has not released, with the id of the process that
#: claimed each: a child forked from this process inherits the table, not the stores.
_OWN: dict[Path, int] = {}
_OWN_LOCK = threading.Lock()


def staged_bytes(directory: Path) -> int:
    """Bytes of the staged stores in ``directory`` (every process's), their files summed."""
    total = 0
    for store in directory.glob(f"{STORE_PREFIX}*.zarr"):
        for root, _, files in os.walk(store):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(root, name)).st_size
    return total


def claim(store: Path) -> None:
    """Write ``store``'s owner file (this process), before the store is written.

    Written to a temporary name and renamed, so that no reader sees half of it. The store is
    released when this process exits, or by :func:`remove_staged_stores`.
    """
    with _OWN_LOCK:
        _OWN[store] = os.getpid()
    target = owner_file(store)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_text(json.dumps(_this_process()))
    os.replace(partial, target)


def release(store: Path) -> None:
    """Remove ``store`` and its owner file (either may be missing, or not removable)."""
    with _OWN_LOCK:
        _OWN.pop(store, None)
    shutil.rmtree(store, ignore_errors=True)
    with contextlib.suppress(OSError):  # a read-only disk: nothing was written there either
        owner_file(store).unlink(missing_ok=True)


def remove_staged_stores() -> list[Path]:
    """Remove the data this process staged on disk, to free the disk before it exits.

    A plan that stages (a rechunk no worker's memory holds) writes its input to a temporary
    Zarr store, and its result reads from that store each time it is computed. The stores are
    removed when this Python process exits; a long session (a notebook, a script over many
    variables) keeps one per staged ``apply`` until then. Call this once every result of a
    staged plan is computed, written or persisted, and not while another thread stages: a
    result computed after its store is removed raises a
    :class:`~xarray_memchunk.MemchunkError` that says so
    (:class:`~xarray_memchunk.operators.staged_zarr.StagedStore`).

    Returns
    -------
    list of Path
        The stores removed.
    """
    with _OWN_LOCK:
        stores = sorted(p for p, pid in _OWN.items() if pid == os.getpid())
    for store in stores:
        release(store)
    return stores


atexit.register(remove_staged_stores)


def _gone(owner: dict[str, object], machine: dict[str, object]) -> bool:
    """Whether the process ``owner`` names ran here and has ended (or ended unreaped: a zombie).

    Here: on this ``machine``, in this pid namespace (:func:`_machine`).
    """
    import psutil

    if any(owner.get(key) != value for key, value in machine.items()):
        return False
    pid, started, ticks = owner.get("pid"), owner.get("started"), owner.get("start_ticks")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if "boot_id" in machine:  # Linux: the start in ticks after boot, whatever the clock did
        if not isinstance(ticks, int):
            return False
        linux = _linux_start(pid)
        return linux is None or linux[1] or linux[0] != ticks
    if not isinstance(started, int | float):
        return False
    try:
        process = psutil.Process(pid)
        # a process id is reused: the one running under it must be the one that started then
        return process.status() == psutil.STATUS_ZOMBIE or abs(process.create_time() - started) > 1
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to look at (access denied): it may be running
        return False


def remove_orphans(directory: Path) -> list[Path]:
    """Remove the staged stores in ``directory`` whose owner process on this host has ended.

    Returns
    -------
    list of Path
        The stores removed (an owner file whose store is missing is removed, not listed).
    """
    removed, machine = [], _machine()
    for marker in sorted(directory.glob(f"{STORE_PREFIX}*.zarr{OWNER_SUFFIX}")):
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads(marker.read_text())
            if not isinstance(owner, dict) or not _gone(owner, machine):
                continue
            store = marker.with_name(marker.name.removesuffix(OWNER_SUFFIX))
            if store.exists():
                removed.append(store)
            release(store)
    return removed

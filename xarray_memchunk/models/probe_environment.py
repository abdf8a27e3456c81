"""What a fresh probe process imports, kept between sessions, so that a probe may be forked.

A probe process started with ``python -m`` imports the package, xarray and Dask before it
measures anything: 1.5-2.3 s of a first plan on a 2-core machine. This process has imported
them already, and forking it starts a probe at once. A forked probe has imported more than a
fresh one, though: what this process imported for its own work. Self-calibration records how
much running the operator raises a process's memory (a function that groups with flox
imports numba, about 80 MiB), and a worker that runs the operator later holds that rise; in
a forked probe, the modules the operator uses that this process had imported are not
imported again, and their memory would be missed.

So a forked probe records which modules the operator's first run used
(:func:`record_used_modules`); those a fresh probe lacks (:func:`fresh_probe_modules`) are
imported in a spawned probe, and the memory that took is added to the rise
(:func:`import_rise`). Both facts depend only on the Python environment and are kept in a
JSON file per environment (:func:`environment_file`), so that later sessions fork at once.
Where the file is missing (the first plan in an environment) the probe is spawned, and the
file is written from it.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "environment_file",
    "fork_allowed",
    "fresh_probe_modules",
    "import_rise",
    "known_import_bytes",
    "modules_at_start",
    "record_used_modules",
    "remember_fresh_modules",
    "remember_import_bytes",
    "used_modules",
]

#: The modules this process held when it started serving as a probe (set by the child).
_AT_START: list[str] = []
#: The modules this process held when it was forked, and those the operator's first run used.
_AT_FORK: set[str] = set()
_USED: set[str] = set()


def cache_dir() -> Path:
    """Directory of facts kept between sessions: dask config ``memchunk.cache-dir``.

    By default ``$XDG_CACHE_HOME/xarray-memchunk`` (``~/.cache/xarray-memchunk``).
    """
    import dask

    configured = dask.config.get("memchunk.cache-dir", None)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xarray-memchunk"


def _newest_mtime(directory: Path) -> float:
    """The newest modification time of the ``.py`` files under ``directory``."""
    return max((p.stat().st_mtime for p in directory.rglob("*.py")), default=0.0)


def environment_file() -> Path:
    """The JSON file of the facts kept for this Python environment (see the module docstring).

    Named by a hash of the interpreter, its version, the import path, the modification time
    of each of its directories inside the environment (installing or removing a package
    changes its directory's; a script's own directory, where files come and go, is not
    looked at) and of this package's source files: another environment, or a changed one,
    has its own file.
    """
    from .. import __version__

    package = Path(__file__).resolve().parents[1]
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    stamps: list[Any] = []
    for entry in sys.path:
        stamps.append(entry)
        if entry.startswith(prefixes):
            with contextlib.suppress(OSError):
                stamps.append(os.stat(entry).st_mtime)
    key = json.dumps(
        [sys.executable, sys.version, __version__, stamps, _newest_mtime(package)], default=str
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / f"probe-environment-{digest}.json"


def _read() -> dict[str, Any]:
    """The facts kept for this environment; ``{}`` where none are (or the file is unreadable)."""
    try:
        facts = json.loads(environment_file().read_text())
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def _write(facts: dict[str, Any]) -> None:
    """Keep ``facts`` for this environment; nothing is kept where the directory is not writable."""
    path = environment_file()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(facts, sort_keys=True))
        os.replace(partial, path)


def fresh_probe_modules() -> frozenset[str] | None:
    """The modules a probe process started with ``python -m`` holds before its first call.

    None where no spawned probe has reported them in this environment yet.
    """
    modules = _read().get("fresh_modules")
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        return None
    return frozenset(modules)


def remember_fresh_modules(modules: list[str]) -> None:
    """Keep the module names a spawned probe reported (:func:`modules_at_start`)."""
    facts = _read()
    facts["fresh_modules"] = sorted(modules)
    _write(facts)


def known_import_bytes(modules: list[str]) -> int | None:
    """What importing ``modules`` took in a fresh probe, where it was measured before."""
    value = _read().get("import_bytes", {}).get(",".join(sorted(modules)))
    return int(value) if isinstance(value, int) else None


def remember_import_bytes(modules: list[str], nbytes: int) -> None:
    """Keep what importing ``modules`` took in a fresh probe (:func:`import_rise`)."""
    facts = _read()
    facts.setdefault("import_bytes", {})[",".join(sorted(modules))] = int(nbytes)
    _write(facts)


def fork_allowed() -> bool:
    """Whether a probe process may be forked from this process now.

    The dask config key ``memchunk.probe-process-start`` decides: ``"spawn"`` never forks,
    ``"fork"`` forks wherever it is safe, and ``"auto"`` (the default) forks where it is
    safe and a spawned probe's modules are known for this environment
    (:func:`fresh_probe_modules`). Safe means: Linux (forking a process that used macOS
    system frameworks is not), no other Python thread in this process (a lock one holds
    would stay held in the child for ever), no GPU runtime imported (CUDA does not survive a
    fork), and no objects frozen from garbage collection (``gc.freeze``: the fork freezes
    this process's objects while it forks, and thaws them after).
    """
    import dask

    setting = dask.config.get("memchunk.probe-process-start", "auto")
    if setting not in ("auto", "fork", "spawn"):
        raise ValueError(
            f"memchunk.probe-process-start is {setting!r}: use 'auto', 'fork' or 'spawn'"
        )
    if setting == "spawn" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() > 1 or "cupy" in sys.modules or gc.get_freeze_count():
        return False
    return setting == "fork" or fresh_probe_modules() is not None


def modules_at_start() -> list[str]:
    """In a spawned probe: the modules it held before its first call."""
    return list(_AT_START)


def _record(frame: FrameType, event: str, arg: object) -> None:
    """A profile hook: note the module of each function called."""
    if event == "call":
        _USED.add(str(frame.f_globals.get("__name__", "")))
    elif event == "c_call":
        _USED.add(str(getattr(arg, "__module__", None) or ""))


@contextlib.contextmanager
def record_used_modules():
    """In a forked probe: note the modules whose functions run meanwhile, in any thread."""
    if not _AT_FORK:
        _AT_FORK.update(sys.modules)
    sys.setprofile(_record)
    threading.setprofile(_record)
    try:
        yield
    finally:
        threading.setprofile(None)
        sys.setprofile(None)


def used_modules() -> list[str]:
    """In a forked probe: the modules it held when forked that the recorded calls used.

    The standard library's are left out: every Python process has them.
    """
    stdlib = sys.stdlib_module_names
    return sorted(m for m in _USED & _AT_FORK if m and m.partition(".")[0] not in stdlib)


def import_rise(modules: list[str]) -> int:
    """In a fresh probe: the resident memory that importing ``modules`` takes.

    A name that cannot be imported (a module made at run time) is skipped.
    """
    from .profiling import resident_bytes

    before = resident_bytes()
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return max(0, resident_bytes() - before)

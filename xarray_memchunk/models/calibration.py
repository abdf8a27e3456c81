r"""Calibrations: fitted memory-model coefficients stored as JSON (never pickles).

One file per operator and device, ``{operator}-{device}.json``, holding one fit per dtype::

    {"format": "xarray-memchunk-calibration/1", "operator": "gst3d", "device": "cpu",
     "fits": {"float32": {"coefficients": {...}, "intercept": ..., "seconds_per_element": ...,
                          "fit": {...}, "profiles": [...]}},
     "created": "...", "versions": {...}, "machine": {...}}

An operator name that is not a plain file name (characters other than ``A-Z a-z 0-9 . _ -``,
a leading dot, or longer than 100 characters, e.g. ``"smooth/3x3"``) is stored under a safe
name: those characters replaced by ``_`` and a short hash of the name appended, so distinct
names keep distinct files and every file stays inside its directory.

A user calibration (made by :func:`xarray_memchunk.calibrate`) takes precedence over the one
shipped with the package. User calibrations live in, first found:

1. the directory in the environment variable ``MEMCHUNK_CALIBRATION_DIR``;
2. the dask config key ``memchunk.calibration-dir``;
3. the platform's user data directory: ``$XDG_DATA_HOME/xarray-memchunk/calibrations``
   (``~/.local/share/...`` on Linux), ``~/Library/Application Support/xarray-memchunk/
   calibrations`` on macOS, ``%LOCALAPPDATA%\\xarray-memchunk\\calibrations`` on Windows.

Every file is validated against the schema above before it is used: the format, the operator
and device it was looked up as, coefficients (by feature name), intercept and
``seconds_per_element`` finite and non-negative numbers, ``fit`` an object (its
``max_task_elements``, ``next_block_peak_bytes``, ``whole_array_elements`` and
:data:`RESIDENT_KEYS`, where present, numbers, its ``work_per_element`` a number above 0),
``profiles`` a list of measured tasks.
Loading only parses JSON; it never runs code.

A file that fails is an error, never skipped: :class:`~xarray_memchunk.errors.CalibrationError`
names the file and what is wrong in it, before anything is computed. Planning without it
silently could plan with a different model than the user made, so the user decides: delete
the file (the shipped calibration, or a new measurement, takes its place) or run
``memchunk calibrate`` again, which replaces an invalid file instead of merging into it.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
import reprlib
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import dask
import numpy as np

from ..errors import CalibrationError
from .fitting import time_per_element
from .memory_model import LinearMemoryModel

__all__ = [
    "FORMAT",
    "Calibration",
    "calibration_dir",
    "calibration_file_name",
    "describe_calibration",
    "load_calibration",
    "short_path",
    "save_calibration",
    "read_json",
    "shipped_dir",
    "write_json_atomically",
    "writable_calibration_dir",
]

FORMAT = "xarray-memchunk-calibration/1"
#: A fit's figures that say what running the operator left in the measuring process.
RESIDENT_KEYS = ("resident_before_bytes", "resident_after_bytes")

#: A file name stem used as it is: safe characters, no leading dot, not too long.
_PLAIN_STEM = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_UNSAFE_CHARACTER = re.compile(r"[^A-Za-z0-9._-]")


class _Invalid(ValueError):
    """What is wrong in a calibration document (wrapped into a CalibrationError by callers)."""


@dataclass(frozen=True)
class Calibration:
    """A fitted memory model (and time per element) of one operator, device and dtype.

    Attributes
    ----------
    operator, device, dtype
        What it was fitted for.
    model
        The fitted :class:`LinearMemoryModel`.
    seconds_per_element
        Median compute time per padded input element, from the same profiles.
    path
        File it was read from.
    metadata
        Fit errors, library versions, machine, date.
    profiles
        The measured tasks it was fitted on (``extents``, ``sizes``, ``peak_bytes``, ...).
    """

    operator: str
    device: str
    dtype: str
    model: LinearMemoryModel
    seconds_per_element: float
    path: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    profiles: tuple[dict[str, Any], ...] = ()

    def seconds_per_element_at(
        self,
        sizes: Mapping[str, int],
        work_of: Callable[[Mapping[str, int]], float] | None = None,
    ) -> float:
        """:attr:`seconds_per_element` for an array of ``sizes`` (dim -> length).

        Scaled by the array's work per element (``work_of``, the operator's
        :attr:`~xarray_memchunk.operators.base.Cost.work_per_element`) over the work the
        calibration's tasks were timed at: the fit's ``work_per_element``, or where a file
        predates it, that of its profiles. As measured where either is unknown (an operator
        whose work per element does not depend on the array, a GPU's calibration).
        """
        if work_of is None:
            return self.seconds_per_element
        measured_at = self.metadata.get("fit", {}).get("work_per_element")
        if measured_at is None:
            measured_at = self._work_of_profiles(work_of)
        if not measured_at:
            return self.seconds_per_element
        return self.seconds_per_element * work_of(sizes) / float(measured_at)

    def _work_of_profiles(self, work_of: Callable[[Mapping[str, int]], float]) -> float | None:
        """The work the profiles' time per element was measured at; None if they lack times."""
        sizes = [p.get("sizes") or p["extents"] for p in self.profiles]
        seconds = [p.get("seconds") for p in self.profiles]
        if not sizes or not all(isinstance(s, int | float) and s >= 0 for s in seconds):
            return None
        elements = [math.prod(s.values()) for s in sizes]
        works = [work_of(s) for s in sizes]
        return time_per_element(np.array(elements), np.array(seconds), np.array(works))[1]

    def held_after_running(self, idle: int) -> int | None:
        """What a worker holds between tasks once it has run the operator; None if unknown.

        Running a function the first time imports what it needs and fills caches, and a
        worker keeps them: a function that groups with flox imports numba, about 90 MiB.
        Self-calibration records the measuring process's resident memory before and after
        its runs (:data:`RESIDENT_KEYS`); a worker that held ``idle`` bytes (the budget's
        baseline) holds that rise on top. Only the rise is taken from the measurement, so a
        measuring process that held less than ``idle`` (a fresh one) or more (a worker with
        data from earlier work) gives the same figure, and what ``idle`` allows for beyond
        the libraries (the input's file backend and open files) stays allowed for.
        """
        figures = self.metadata.get("fit", {})
        before, after = (figures.get(k) for k in RESIDENT_KEYS)
        if before is None or after is None:
            return None
        return int(idle + max(0, after - before))


def shipped_dir() -> Path:
    """Directory of the calibrations shipped with the package."""
    return Path(__file__).parent / "calibrations"


def short_path(path: str | os.PathLike) -> str:
    """``path`` with the user's home directory written ``~``: ``~/.local/share/...``."""
    full = Path(path).expanduser()
    home = Path.home()
    if home != Path(home.anchor) and full.is_relative_to(home):
        return str(Path("~") / full.relative_to(home))
    return str(full)


def describe_calibration(path: str | os.PathLike) -> str:
    """A calibration file as a plan's notes name it: whose it is, and which.

    ``shipped calibration median-cpu.json`` for one shipped with the package, ``your
    calibration ~/.local/share/xarray-memchunk/calibrations/f-cpu.json`` for the user's.
    """
    if Path(path).parent == shipped_dir():
        return f"shipped calibration {Path(path).name}"
    return f"your calibration {short_path(path)}"


def calibration_dir() -> Path:
    """Directory of the user's own calibrations (see the module docstring for the order)."""
    env = os.environ.get("MEMCHUNK_CALIBRATION_DIR")
    if env:
        return Path(env).expanduser()
    configured = dask.config.get("memchunk.calibration-dir", None)
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return base / "xarray-memchunk" / "calibrations"


def writable_calibration_dir(directory: str | os.PathLike | None = None) -> Path:
    """Create ``directory`` if needed and check that a file can be written in it.

    Call it before measuring anything, so that a calibration is never measured for nothing.
    The check writes (and removes) a small file: permission bits alone do not say whether a
    write succeeds (root, read-only file systems, ``/sys``).

    Parameters
    ----------
    directory
        Where calibrations are to be written; the user calibration directory
        (:func:`calibration_dir`) by default.

    Returns
    -------
    Path
        The directory, created.

    Raises
    ------
    CalibrationError
        When the directory cannot be created or written, naming it and what to do.
    """
    target = Path(directory) if directory is not None else calibration_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".memchunk-probe-", dir=target):
            pass
    except OSError as exc:
        where = (
            "pass a writable directory instead"
            if directory is not None
            else "set the environment variable MEMCHUNK_CALIBRATION_DIR or the dask config "
            "key memchunk.calibration-dir to a writable directory"
        )
        reason = "it is a file, not a directory" if target.is_file() else exc.strerror or exc
        raise CalibrationError(f"cannot write calibrations in {target}: {reason}; {where}") from exc
    return target


def calibration_file_name(operator: str, device: str) -> str:
    """File name of the calibration of ``operator`` on ``device``, always a plain file name.

    ``{operator}-{device}.json`` where that is a plain file name; otherwise the unsafe
    characters are replaced by ``_`` and a hash of ``(operator, device)`` is appended, so that
    the name has no directory part and distinct operators keep distinct files.
    """
    stem = f"{operator}-{device}"
    if _PLAIN_STEM.fullmatch(stem):
        return f"{stem}.json"
    digest = hashlib.sha256(json.dumps([operator, device]).encode()).hexdigest()[:12]
    safe = _UNSAFE_CHARACTER.sub("_", stem).lstrip(".")[:80]
    return f"{safe}-{digest}.json"


def _how_to_fix(path: str | os.PathLike) -> str:
    """What the user can do about an invalid calibration file."""
    if Path(path).parent == shipped_dir():
        return "the installed package is damaged: reinstall xarray-memchunk"
    return (
        f"delete {path} (the operator is then planned with its shipped calibration, or "
        f"measured again) or calibrate it again (`memchunk calibrate`)"
    )


def _describe(value: Any) -> str:
    """A short text of a JSON value for an error message."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _object(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` if it is a JSON object with string keys."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"{where} must be an object, not {_describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise _Invalid(f"{where} has a name that is not a string: {_describe(key)}")
    return value


def _number(value: Any, where: str) -> float:
    """``value`` as a float, if it is a finite, non-negative JSON number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Invalid(f"{where} must be a number, not {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        number = math.inf
    if not (math.isfinite(number) and number >= 0):
        raise _Invalid(f"{where} must be a finite number >= 0, not {reprlib.repr(value)}")
    return number


def _numbers(value: Any, where: str) -> dict[str, float]:
    """An object of finite, non-negative numbers, by name."""
    return {k: _number(v, f"{where}[{k!r}]") for k, v in _object(value, where).items()}


def _check_profiles(value: Any, where: str) -> None:
    """The measured tasks of a fit: a list of objects with ``extents`` and ``peak_bytes``."""
    if not isinstance(value, list):
        raise _Invalid(f"{where} must be a list, not {_describe(value)}")
    for i, profile in enumerate(value):
        _object(profile, f"{where}[{i}]")
        for key in ("extents", "peak_bytes"):
            if key not in profile:
                raise _Invalid(f"{where}[{i}] lacks {key!r}")
        _numbers(profile["extents"], f"{where}[{i}]['extents']")
        _number(profile["peak_bytes"], f"{where}[{i}]['peak_bytes']")
        for key in ("sizes", "features"):
            if key in profile:
                _numbers(profile[key], f"{where}[{i}][{key!r}]")


def _check_fit(fit: Any, where: str) -> None:
    """One dtype's fit: coefficients, intercept, time per element, fit figures, profiles."""
    _object(fit, where)
    for key in ("coefficients", "intercept", "seconds_per_element"):
        if key not in fit:
            raise _Invalid(f"{where} lacks {key!r}")
    _numbers(fit["coefficients"], f"{where}['coefficients']")
    _number(fit["intercept"], f"{where}['intercept']")
    _number(fit["seconds_per_element"], f"{where}['seconds_per_element']")
    figures = _object(fit.get("fit", {}), f"{where}['fit']")
    for key in (
        "max_task_elements",
        "next_block_peak_bytes",
        "whole_array_elements",
        *RESIDENT_KEYS,
    ):
        if figures.get(key) is not None:
            _number(figures[key], f"{where}['fit'][{key!r}]")
    if "work_per_element" in figures and not _number(
        figures["work_per_element"], f"{where}['fit']['work_per_element']"
    ):
        raise _Invalid(f"{where}['fit']['work_per_element'] must be above 0, not 0")
    _check_profiles(fit.get("profiles", []), f"{where}['profiles']")


def _check_document(document: Any) -> None:
    """Validate a whole calibration document against the schema (module docstring).

    Raises
    ------
    _Invalid
        Saying what is wrong and where.
    """
    _object(document, "the document")
    if document.get("format") != FORMAT:
        raise _Invalid(f"it is not an xarray-memchunk calibration (expected format {FORMAT!r})")
    for key in ("operator", "device"):
        if key not in document:
            raise _Invalid(f"it lacks {key!r}")
        if not isinstance(document[key], str):
            raise _Invalid(f"{key!r} must be a string, not {_describe(document[key])}")
    fits = _object(document.get("fits"), "'fits'")
    for dtype, fit in fits.items():
        _check_fit(fit, f"fits[{dtype!r}]")


def read_json(path: str | os.PathLike, what: str, how_to_fix: str) -> Any:
    """The JSON document in ``path`` (a ``what``, for messages).

    Raises
    ------
    CalibrationError
        When it cannot be read or parsed; the message says ``how_to_fix``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        # ValueError: not JSON, not UTF-8, or an integer too long; RecursionError: nested
        # too deeply
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CalibrationError(f"cannot read {what} {path}: {reason}; {how_to_fix}") from None


@lru_cache(maxsize=64)
def _read(path: str, mtime: float) -> dict[str, Any]:
    """The calibration document in ``path``, parsed and validated (cached per mtime)."""
    document = read_json(path, "calibration", _how_to_fix(path))
    try:
        _check_document(document)
    except _Invalid as exc:
        raise CalibrationError(f"invalid calibration {path}: {exc}; {_how_to_fix(path)}") from None
    return document


def _parse_fit(document: dict[str, Any], dtype: str, path: str) -> Calibration | None:
    """The ``dtype`` fit of a validated document, or None when it has none."""
    fit = document["fits"].get(dtype)
    if fit is None:
        return None
    return Calibration(
        operator=document["operator"],
        device=document["device"],
        dtype=dtype,
        model=LinearMemoryModel(
            coefficients=dict(fit["coefficients"]),
            intercept=float(fit["intercept"]),
            source=f"calibration {path}",
        ),
        seconds_per_element=float(fit["seconds_per_element"]),
        path=path,
        metadata={k: v for k, v in document.items() if k != "fits"} | {"fit": fit.get("fit", {})},
        profiles=tuple(fit.get("profiles", [])),
    )


def _check_identity(document: Mapping[str, Any], operator: str, device: str, path: str) -> None:
    """Refuse a file that holds another operator's or device's calibration."""
    for key, expected in (("operator", operator), ("device", device)):
        if document[key] != expected:
            raise CalibrationError(
                f"calibration {path} is for {key} {document[key]!r}, not {expected!r}; "
                f"{_how_to_fix(path)}"
            )


def load_calibration(operator: str, device: str, dtype: str) -> Calibration | None:
    """Find the calibration of ``operator`` on ``device`` for ``dtype``: the user's, else shipped.

    Returns
    -------
    Calibration or None
        None when neither the user nor the package has a fit for this dtype.

    Raises
    ------
    CalibrationError
        When a calibration file exists but is not valid (see the module docstring).
    """
    for directory in (calibration_dir(), shipped_dir()):
        path = directory / calibration_file_name(operator, device)
        if path.is_file():
            document = _read(str(path), path.stat().st_mtime)
            _check_identity(document, operator, device, str(path))
            found = _parse_fit(document, dtype, str(path))
            if found is not None:
                return found
    return None


def _existing(path: Path, operator: str, device: str) -> dict[str, Any]:
    """The valid document of ``operator`` on ``device`` in ``path`` to update, or nothing.

    A file that is not a valid calibration of them is replaced, not merged into.
    """
    if not path.is_file():
        return {}
    try:
        document = _read(str(path), path.stat().st_mtime)
        _check_identity(document, operator, device, str(path))
    except CalibrationError:
        return {}
    return document


def write_json_atomically(document: Mapping[str, Any], path: Path) -> None:
    """Write ``document`` as JSON to ``path`` through a temporary file, removed on failure.

    The file is readable by all (``0o644``), not private as the temporary file is (``0o600``):
    a calibration is shipped with the package and shared, not a secret.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_calibration(
    operator: str,
    device: str,
    fits: dict[str, dict[str, Any]],
    metadata: dict[str, Any],
    directory: Path | None = None,
) -> Path:
    """Write (or update) a calibration file, atomically.

    Parameters
    ----------
    operator, device
        Which calibration file (:func:`calibration_file_name`).
    fits
        One entry per dtype: ``coefficients``, ``intercept``, ``seconds_per_element``,
        ``fit`` (error figures) and optionally ``profiles``. Dtypes already in the file and
        not in ``fits`` are kept; a file that is not a valid calibration is replaced.
    metadata
        Top-level facts: ``created``, ``versions``, ``machine``.
    directory
        Where to write; the user calibration directory by default.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    CalibrationError
        When the directory cannot be written, or ``fits`` do not pass the schema (nothing is
        written then).
    """
    path = writable_calibration_dir(directory) / calibration_file_name(operator, device)
    identity = {"format": FORMAT, "operator": operator, "device": device}
    document = _existing(path, operator, device) | metadata | identity
    document["fits"] = dict(document.get("fits", {})) | fits
    try:
        _check_document(document)
    except _Invalid as exc:
        raise CalibrationError(f"not writing calibration {path}: {exc}") from None
    try:
        write_json_atomically(document, path)
    except OSError as exc:
        raise CalibrationError(f"cannot write calibration {path}: {exc}") from exc
    return path

r"""Calibrations: fitted memory-model coefficients stored as JSON (never pickles).

One file per operator and device, ``{operator}-{device}.json``, holding one fit per dtype::

    {"format": "xarray-memchunk-calibration/1", "operator": "gst3d", "device": "cpu",
     "fits": {"float32": {"coefficients": {...}, "intercept": ..., "seconds_per_element": ...,
                          "fit": {...}, "profiles": [...]}},
     "created": "...", "versions": {...}, "machine": {...}}

A user calibration (made by :func:`xarray_memchunk.calibrate`) takes precedence over the one
shipped with the package. User calibrations live in, first found:

1. the directory in the environment variable ``MEMCHUNK_CALIBRATION_DIR``;
2. the dask config key ``memchunk.calibration-dir``;
3. the platform's user data directory: ``$XDG_DATA_HOME/xarray-memchunk/calibrations``
   (``~/.local/share/...`` on Linux), ``~/Library/Application Support/xarray-memchunk/
   calibrations`` on macOS, ``%LOCALAPPDATA%\\xarray-memchunk\\calibrations`` on Windows.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import dask

from ..errors import CalibrationError
from .memory_model import LinearMemoryModel

__all__ = [
    "FORMAT",
    "Calibration",
    "calibration_dir",
    "load_calibration",
    "save_calibration",
    "shipped_dir",
]

FORMAT = "xarray-memchunk-calibration/1"


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

    @property
    def lower_bound(self) -> bool:
        """Whether the model was grown to a killed task's floor, not to a measured peak.

        A task that killed its worker left no record; the run only shows it needed at least
        what killed the worker (:mod:`xarray_memchunk.runs`). Such a model is not to be planned
        with: the operator is measured again first.
        """
        return bool(self.metadata.get("fit", {}).get("lower_bound", False))


def shipped_dir() -> Path:
    """Directory of the calibrations shipped with the package."""
    return Path(__file__).parent / "calibrations"


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


def _file_name(operator: str, device: str) -> str:
    return f"{operator}-{device}.json"


@lru_cache(maxsize=64)
def _read(path: str, mtime: float) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"cannot read calibration {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CalibrationError(
            f"{path} is not an xarray-memchunk calibration (expected format {FORMAT!r}); "
            f"delete it or run `memchunk calibrate` again"
        )
    return document


def _parse_fit(document: dict[str, Any], dtype: str, path: str) -> Calibration | None:
    fit = document.get("fits", {}).get(dtype)
    if fit is None:
        return None
    try:
        coefficients = {str(k): float(v) for k, v in fit["coefficients"].items()}
        model = LinearMemoryModel(
            coefficients=coefficients,
            intercept=float(fit["intercept"]),
            source=f"calibration {path}",
        )
        seconds = float(fit["seconds_per_element"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CalibrationError(f"malformed {dtype} fit in calibration {path}: {exc!r}") from exc
    return Calibration(
        operator=document["operator"],
        device=document.get("device", "cpu"),
        dtype=dtype,
        model=model,
        seconds_per_element=seconds,
        path=path,
        metadata={k: v for k, v in document.items() if k != "fits"} | {"fit": fit.get("fit", {})},
        profiles=tuple(fit.get("profiles", [])),
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
        When a calibration file exists but is not valid.
    """
    for directory in (calibration_dir(), shipped_dir()):
        path = directory / _file_name(operator, device)
        if path.is_file():
            found = _parse_fit(_read(str(path), path.stat().st_mtime), dtype, str(path))
            if found is not None:
                return found
    return None


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
        Which calibration file.
    fits
        One entry per dtype: ``coefficients``, ``intercept``, ``seconds_per_element``,
        ``fit`` (error figures) and optionally ``profiles``. Dtypes already in the file and
        not in ``fits`` are kept.
    metadata
        Top-level facts: ``created``, ``versions``, ``machine``.
    directory
        Where to write; the user calibration directory by default.

    Returns
    -------
    Path
        The file written.
    """
    directory = Path(directory) if directory is not None else calibration_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _file_name(operator, device)
    document: dict[str, Any] = {"format": FORMAT, "operator": operator, "device": device}
    if path.is_file():
        document = _read(str(path), path.stat().st_mtime) | document
    document = document | metadata
    document["fits"] = dict(document.get("fits", {})) | fits
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path

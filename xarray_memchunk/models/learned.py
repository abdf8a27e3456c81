"""What runs taught about an operator's memory, kept beside its calibration, never inside it.

A run on a cluster (:mod:`xarray_memchunk.measure.runs`) may find an operator's own task above
its prediction. That evidence is stored here, in the user calibration directory, as
``{calibration}-{device}.learned.json``, a list of observations: the task's features, what was
measured, and whether it is a measurement or only a floor (a worker that memory killed left no
record; the task needed at least what killed it).

The calibration a plan starts from (shipped with the package, made by
:func:`xarray_memchunk.calibrate`, or measured by self-calibration) is never rewritten. A plan
combines the two (:class:`LearnedMemoryModel`): the larger of the calibration's model scaled by
the largest ratio of a measured task to what that model predicts for it (:func:`learned_scale`)
and the model plus the largest excess of a measured task over it (:meth:`Learned.shift`). A
task's excess may be in proportion to it or fixed (a thin task read from a netCDF file measured
4-7 MiB above its prediction at every size); the next plan's tasks are smaller than the one
measured, where the ratio alone left them under-predicted again (a second run at a stated
minimum paused a worker for good). So learning:

- only ever raises a prediction (a scale below 1 is not applied), and never drops a term;
- is bounded: one observation raises the scale by at most :data:`MAX_SCALE_PER_RUN`; a floor,
  or a task further above its prediction than that, asks for the operator to be measured
  again where it can be (a NumPy function), instead of being trusted;
- is visible (the plan's notes name the file and the scale) and reversible
  (:func:`forget_learned`, ``memchunk calibrate OP --forget``).
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from dask.utils import format_bytes

from ..errors import CalibrationError
from .calibration import (
    _Invalid,
    _number,
    _numbers,
    _object,
    calibration_dir,
    read_json,
    write_json_atomically,
)
from .memory_model import LinearMemoryModel

__all__ = [
    "LEARNED_FORMAT",
    "MAX_SCALE_PER_RUN",
    "Learned",
    "LearnedMemoryModel",
    "Observation",
    "forget_command",
    "forget_learned",
    "learned_path",
    "load_kept",
    "load_learned",
    "read_only",
    "record_kept",
    "record_observation",
    "settle_observations",
]

LEARNED_FORMAT = "xarray-memchunk-learned/1"
#: The most one observation may raise a prediction: x2. A task measured further above its
#: prediction than that says the model is wrong, not a little short: the operator is measured
#: again (self-calibrating operators) or the plan says so.
MAX_SCALE_PER_RUN = 2.0
#: Observations kept per dtype (the oldest are dropped).
KEPT_OBSERVATIONS = 50


@dataclass(frozen=True)
class Observation:
    """One operator task measured in a run.

    Attributes
    ----------
    features
        The task's memory-model features, as the planner computed them.
    measured_bytes
        Its peak (for a floor: what killed the worker, less its baseline).
    predicted_bytes
        What the plan predicted for it.
    floor
        True when the task killed its worker: ``measured_bytes`` is a lower bound only.
    settled
        True once the operator was measured again after it (it asks for no new measurement).
    """

    features: Mapping[str, float]
    measured_bytes: float
    predicted_bytes: float
    floor: bool = False
    settled: bool = False

    @property
    def asks_for_measuring(self) -> bool:
        """Whether the run says the model is wrong, not a little short.

        A floor (the task's peak is unknown), or a task above :data:`MAX_SCALE_PER_RUN` times
        its prediction, which the bounded scale does not cover; until measured again.
        """
        beyond = self.measured_bytes > MAX_SCALE_PER_RUN * self.predicted_bytes
        return not self.settled and (self.floor or beyond)

    def ratio(self, model: LinearMemoryModel) -> float:
        """Measured over what ``model`` predicts for this task, bounded; 1 when it cannot say.

        The bound is :data:`MAX_SCALE_PER_RUN` times what the run's plan predicted, so one
        run raises a prediction at most that much beyond what it was when the run was planned.
        """
        predicted = self._predicted(model)
        if predicted is None or predicted <= 0:
            return 1.0
        return self._bounded(predicted) / predicted

    def excess(self, model: LinearMemoryModel) -> float:
        """Measured less what ``model`` predicts for this task, bounded as :meth:`ratio`; >= 0."""
        predicted = self._predicted(model)
        if predicted is None:
            return 0.0
        return max(0.0, self._bounded(predicted) - predicted)

    def _predicted(self, model: LinearMemoryModel) -> float | None:
        """What ``model`` predicts for this task; None for a model of other features."""
        if set(model.coefficients) - set(self.features):
            return None  # the observation says nothing of it
        return float(model.peak_bytes({k: [v] for k, v in self.features.items()})[0])

    def _bounded(self, predicted: float) -> float:
        """The measured bytes, at most :data:`MAX_SCALE_PER_RUN` times the larger prediction."""
        return min(self.measured_bytes, MAX_SCALE_PER_RUN * max(self.predicted_bytes, predicted))


@dataclass(frozen=True)
class Learned:
    """The observations of one operator (calibration key), device and dtype.

    Attributes
    ----------
    path
        The file they were read from.
    observations
        What runs measured above the predictions of their time.
    """

    path: Path
    observations: tuple[Observation, ...]

    @property
    def asks_for_measuring(self) -> bool:
        """Whether an observation asks for the operator to be measured again (see there)."""
        return any(o.asks_for_measuring for o in self.observations)

    def scale(self, model: LinearMemoryModel) -> float:
        """The factor ``model`` is raised by: see :func:`learned_scale`."""
        return learned_scale(self.observations, model)

    def shift(self, model: LinearMemoryModel) -> float:
        """The bytes ``model`` is raised by: the largest excess of a task measured over it."""
        return max([0.0, *(o.excess(model) for o in self.observations)])

    def applied_to(self, model: LinearMemoryModel) -> LinearMemoryModel | LearnedMemoryModel:
        """``model`` raised as runs taught (:class:`LearnedMemoryModel`); itself where not."""
        factor = self.scale(model)
        if factor <= 1.0:
            return model
        shift = self.shift(model)
        raised = _described(factor, shift)
        return LearnedMemoryModel(
            model, factor, shift, f"{model.source}, {raised} ({self.path.name})"
        )

    def describe(self, model: LinearMemoryModel) -> str:
        """How ``model`` is raised, for a plan's notes: ``x1.63 or +5.80 MiB, whichever ...``."""
        return _described(self.scale(model), self.shift(model))


def _described(scale: float, shift: float) -> str:
    """``x1.63 or +5.80 MiB, whichever is more, learned from runs``."""
    return f"x{scale:.2f} or +{format_bytes(int(shift))}, whichever is more, learned from runs"


@dataclass(frozen=True)
class LearnedMemoryModel:
    """A memory model raised as runs taught: the larger of ``base`` scaled and ``base`` shifted.

    Parameters
    ----------
    base
        The calibration's (or the operator's own) model.
    scale
        The factor of :func:`learned_scale`.
    shift
        The bytes of :meth:`Learned.shift`.
    source
        Where the numbers came from, for the plan's notes.
    """

    base: LinearMemoryModel
    scale: float
    shift: float
    source: str = "learned"

    def peak_bytes(self, features: Mapping[str, Any]) -> np.ndarray:
        """Predicted peak bytes of one task per candidate: the larger raise of ``base``'s."""
        predicted = self.base.peak_bytes(features)
        return np.ceil(np.maximum(predicted * self.scale, predicted + self.shift))


def learned_scale(observations: tuple[Observation, ...], model: LinearMemoryModel) -> float:
    """The largest measured / predicted ratio of the observations under ``model``, at least 1.

    Each ratio is computed against ``model`` as it is now, so a model measured again after the
    run keeps only the part of the evidence it does not already explain. Each observation
    counts for at most :data:`MAX_SCALE_PER_RUN` times what its run's plan predicted.
    """
    return max([1.0, *(o.ratio(model) for o in observations)])


def learned_path(calibration: str, device: str, directory: Path | None = None) -> Path:
    """The file of what runs taught about ``calibration`` on ``device``."""
    from .calibration import calibration_file_name

    name = calibration_file_name(calibration, device)
    return (directory or calibration_dir()) / name.replace(".json", ".learned.json")


def forget_command(calibration: str) -> str:
    """The command line that forgets what runs taught about ``calibration``, quoted."""
    import shlex

    return f"`memchunk calibrate {shlex.quote(calibration)} --forget`"


def _forget(calibration: str) -> str:
    """What to do about a learned file of ``calibration`` that cannot be read."""
    return f"forget what runs taught with {forget_command(calibration)}, or delete the file"


def _parse(entry: Any, path: Path, calibration: str) -> Observation:
    """One observation of a learned file, validated as calibrations are."""
    try:
        fields = _object(entry, "an observation")
        features = _numbers(fields.get("features"), "its features")
        measured = _number(fields.get("measured_bytes"), "its measured_bytes")
        predicted = _number(fields.get("predicted_bytes"), "its predicted_bytes")
    except _Invalid as exc:
        raise CalibrationError(f"invalid {path}: {exc}; {_forget(calibration)}") from None
    return Observation(
        features=features,
        measured_bytes=measured,
        predicted_bytes=predicted,
        floor=bool(fields.get("floor", False)),
        settled=bool(fields.get("settled", False)),
    )


def _read(path: Path, calibration: str) -> dict[str, Any]:
    document = read_json(path, "learned file", _forget(calibration))
    if not isinstance(document, dict) or document.get("format") != LEARNED_FORMAT:
        raise CalibrationError(
            f"{path} is not an xarray-memchunk learned file (format {LEARNED_FORMAT!r}); delete it"
        )
    return document


def load_learned(calibration: str, device: str, dtype: str) -> Learned | None:
    """What runs taught about ``calibration`` on ``device`` for ``dtype``, or None.

    Raises
    ------
    CalibrationError
        When the file exists but is not valid (it names the file and how to forget it).
    """
    path = learned_path(calibration, device)
    if not path.is_file():
        return None
    entries = _read(path, calibration).get("dtypes", {}).get(dtype, [])
    if not isinstance(entries, list):
        raise CalibrationError(f"{path}: observations of {dtype} must be a list")
    observations = tuple(_parse(e, path, calibration) for e in entries)
    if read_only(path):  # frozen by its owner: it cannot be marked settled, so it asks nothing
        observations = tuple(replace(o, settled=True) for o in observations)
    return Learned(path, observations) if observations else None


def record_observation(calibration: str, device: str, dtype: str, observation: Observation) -> Path:
    """Append ``observation`` to the learned file of ``calibration`` (atomically); its path.

    Raises
    ------
    CalibrationError
        When the learned file is read-only (:func:`read_only`), or it or the calibration
        directory cannot be written.
    """
    path, document = _for_update(calibration, device)
    entries = list(document.setdefault("dtypes", {}).get(dtype, []))
    entries.append(
        {
            "features": dict(observation.features),
            "measured_bytes": observation.measured_bytes,
            "predicted_bytes": observation.predicted_bytes,
            "floor": observation.floor,
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
    )
    document["dtypes"][dtype] = entries[-KEPT_OBSERVATIONS:]
    try:
        write_json_atomically(document, path)
    except OSError as exc:
        raise CalibrationError(f"cannot write {path}: {exc}") from None
    return path


#: The learned file's key for what a worker was measured keeping once it ran the operator.
KEPT_KEY = "kept_after_running_bytes"


def load_kept(calibration: str, device: str) -> int | None:
    """What a run measured a worker keep once it ran the operator, or None (never measured).

    See :func:`record_kept`.

    Raises
    ------
    CalibrationError
        When the file exists but is not valid.
    """
    path = learned_path(calibration, device)
    if not path.is_file():
        return None
    return _kept_in(_read(path, calibration), path, calibration)


def _kept_in(document: Mapping[str, Any], path: Path, calibration: str) -> int | None:
    """The learned ``document``'s :data:`KEPT_KEY` figure, checked; None where it has none."""
    value = document.get(KEPT_KEY)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        raise CalibrationError(
            f"{path}: {KEPT_KEY} must be a number of bytes, not {value!r}; {_forget(calibration)}"
        )
    return int(value)


def record_kept(calibration: str, device: str, kept: int) -> Path:
    """Keep ``kept`` in the learned file of ``calibration`` (the largest so far); its path.

    ``kept``: what a worker held between tasks once it ran the operator. Self-calibration
    records what its runs raised the measuring process's memory by
    (:meth:`~xarray_memchunk.models.calibration.Calibration.held_after_running`); a process
    that had imported the operator's libraries for earlier work measures less than a fresh
    worker keeps. The plan counts the larger of the two in its baseline.

    Raises
    ------
    CalibrationError
        As :func:`record_observation`.
    """
    path, document = _for_update(calibration, device)
    document[KEPT_KEY] = max(int(kept), _kept_in(document, path, calibration) or 0)
    try:
        write_json_atomically(document, path)
    except OSError as exc:
        raise CalibrationError(f"cannot write {path}: {exc}") from None
    return path


def _for_update(calibration: str, device: str) -> tuple[Path, dict[str, Any]]:
    """The learned file of ``calibration`` and what it holds, to add to and write back.

    Raises
    ------
    CalibrationError
        Where it cannot be written (:func:`_writable`) or read.
    """
    path = learned_path(calibration, device)
    _writable(path)
    document: dict[str, Any] = {"format": LEARNED_FORMAT, "calibration": calibration}
    if path.is_file():
        document = _read(path, calibration) | document
    document["device"] = device
    return path, document


def _writable(path: Path) -> None:
    """Raise :class:`CalibrationError` where what a run taught cannot be kept in ``path``."""
    if read_only(path):
        raise CalibrationError(
            f"{path} is read-only: what the run taught is not kept there (make the file "
            f"writable to keep learning, or report with learn=False)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CalibrationError(
            f"cannot keep what the run taught in {path.parent}: {exc}; set "
            f"MEMCHUNK_CALIBRATION_DIR to a writable directory, or report with learn=False"
        ) from None


def settle_observations(calibration: str, device: str, dtype: str) -> str:
    """Mark the observations of ``calibration`` settled: the operator was measured again since.

    They stay as evidence (a task the new model does not reach still raises it, bounded), but
    no longer ask for a new measurement. A file that is read-only (:func:`read_only`) is left
    as it is: its observations ask for none already (:func:`load_learned`). One that cannot be
    written otherwise is left as it is too, and the plan goes on: the next plan measures again.

    Returns
    -------
    str
        Empty where the file was marked or there is none; else why it was not.
    """
    path = learned_path(calibration, device)
    if not path.is_file():
        return ""
    if read_only(path):
        return f"{path} is read-only: left as it is (its observations ask for no measurement)"
    document = _read(path, calibration)
    entries = document.get("dtypes", {}).get(dtype, [])
    for entry in entries:
        if isinstance(entry, dict):
            entry["settled"] = True
    try:
        write_json_atomically(document, path)
    except OSError as exc:
        return f"cannot mark {path} measured again ({exc}): the next plan measures again"
    return ""


def read_only(path: Path) -> bool:
    """Whether the learned file ``path`` is read-only: no write bit set, or not writable here.

    No write bit: its owner froze what runs taught (an atomic write replaces a file through
    its directory, whatever the file's own mode, so this is checked first). Not writable by
    this process: another user's file, a read-only mount. Either way it is read, never
    replaced, and its observations ask for no new measurement (:func:`load_learned`).
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not mode & 0o222 or not os.access(path, os.W_OK)


def forget_learned(calibration: str, device: str | None = None) -> list[Path]:
    """Delete what runs taught about ``calibration`` (every device when None); the files removed.

    Raises
    ------
    CalibrationError
        When a file cannot be removed (its directory read-only): those before it are gone.
    """
    devices = [device] if device else ["cpu", "gpu"]
    removed = []
    for each in devices:
        path = learned_path(calibration, each)
        if path.is_file():
            try:
                path.unlink()
            except OSError as exc:
                raise CalibrationError(
                    f"cannot remove {path} ({exc.strerror}): make its directory "
                    f"{path.parent} writable, or set MEMCHUNK_CALIBRATION_DIR to another"
                ) from None
            removed.append(path)
    return removed

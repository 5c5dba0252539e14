"""What differs between the run that saved a checkpoint and the run that loads it.

A pure comparison of two manifests (the saved one, and the description of the resuming run that
`accel_train.checkpoint.run_record.describe_run` gives): ``load_state`` logs one line per difference
(``resume: num_processes 2 -> 1``) and keeps them as ``accelerator.checkpoint_differences``. A field the
saved manifest lacks (written by an older accel) is not compared: nothing is known about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CheckpointDifference", "differences"]

#: Fields compared as one value, in the order the lines are given.
_SCALARS = ("num_processes", "strategy", "mixed_precision")
#: Fields holding an object compared key by key, with the label each key's line starts with.
_OBJECTS = (("mesh", "mesh."), ("backend_settings", "backend."), ("gradient_accumulation", "gradient_accumulation."))
#: Shown for a value one side lacks (a library the other run had not imported).
ABSENT = "absent"


@dataclass(frozen=True)
class CheckpointDifference:
    """One setting that differs: ``field`` (``num_processes``, ``mesh.dp_shard``, ``torch`` ...), the value
    the checkpoint was saved with and the value of the resuming run (`ABSENT` where one side has none)."""

    field: str
    saved: Any
    current: Any

    def __str__(self) -> str:
        return f"resume: {self.field} {_shown(self.saved)} -> {_shown(self.current)}"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def _object_differences(label: str, saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[CheckpointDifference]:
    found = []
    for key in sorted(set(saved) | set(current)):
        before, after = saved.get(key, ABSENT), current.get(key, ABSENT)
        if before != after:
            found.append(CheckpointDifference(f"{label}{key}", before, after))
    return found


def differences(saved: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[CheckpointDifference]:
    """The settings in which the resuming run ``current`` differs from the run that wrote ``saved``.

    Compared: the world size, the backend (strategy), the precision, the size of each mesh dimension,
    the backend's settings (when the backend is the same), the accumulation steps and the library versions. The data position and
    whether the save fell mid-accumulation describe the checkpoint, not the run: they are not compared.

    Args:
        saved: the checkpoint's manifest (``None`` for a folder without one: nothing is compared).
        current: the same fields for the resuming run (``describe_run``).

    Returns:
        One `CheckpointDifference` per differing value, empty when the runs agree.
    """
    if not saved:
        return []
    found: list[CheckpointDifference] = []
    for key in _SCALARS:
        if key in saved and key in current and saved[key] != current[key]:
            found.append(CheckpointDifference(key, saved[key], current[key]))
    for key, label in _OBJECTS:
        before, after = saved.get(key), current.get(key)
        if not isinstance(before, Mapping) or not isinstance(after, Mapping):
            continue
        if key == "backend_settings" and saved.get("strategy") != current.get("strategy"):
            continue  # another backend has other settings: the strategy's own line says it
        if key == "mesh":  # a dimension a run did not record (added later) had size 1
            before, after = {**dict.fromkeys(after, 1), **before}, {**dict.fromkeys(before, 1), **after}
        if key == "gradient_accumulation":  # the phase of the save is not a setting of the run
            before = {k: v for k, v in before.items() if k != "mid_accumulation"}
            after = {k: v for k, v in after.items() if k != "mid_accumulation"}
        found.extend(_object_differences(label, before, after))
    before, after = saved.get("versions"), current.get("versions")
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        # A library one run imported and the other did not is no change of version (DeepSpeed is
        # imported by whatever touched it first): only the libraries both record are compared.
        both = sorted(set(before) & set(after))
        found.extend(_object_differences("", {k: before[k] for k in both}, {k: after[k] for k in both}))
    return found

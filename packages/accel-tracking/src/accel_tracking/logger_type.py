"""The documented names of the integrated trackers (``log_with="wandb"``, ``LoggerType.WANDB``)."""

from __future__ import annotations

import enum

from accel_state.enums import _StrEnum


class _ValueContains(enum.EnumMeta):
    """``"wandb" in LoggerType`` answers for values too (Python 3.11 raises TypeError for a plain str)."""

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, cls):
            return True
        return isinstance(item, str) and item in cls._value2member_map_


class LoggerType(_StrEnum, metaclass=_ValueContains):
    """A tracker that ``Accelerator(log_with=...)`` can create by name.

    ``ALL`` picks every tracker whose library is installed. ``JSONL`` is accel's own dependency-free
    tracker (one JSON-lines file per run in the logging directory).
    """

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    JSONL = "jsonl"

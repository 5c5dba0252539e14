"""Which tracker a name means, which are installed, and ``filter_trackers`` (what ``log_with`` resolves to)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable
from typing import Any

from accel_state.install_hints import install_hint
from accel_tracking.general import GeneralTracker, is_backend_available
from accel_tracking.logger_type import LoggerType
from accel_tracking.trackers.aim import AimTracker
from accel_tracking.trackers.clearml import ClearMLTracker
from accel_tracking.trackers.comet_ml import CometMLTracker
from accel_tracking.trackers.dvclive import DVCLiveTracker
from accel_tracking.trackers.jsonl import JSONLTracker
from accel_tracking.trackers.mlflow import MLflowTracker
from accel_tracking.trackers.swanlab import SwanLabTracker
from accel_tracking.trackers.tensorboard import TensorBoardTracker
from accel_tracking.trackers.trackio import TrackioTracker
from accel_tracking.trackers.wandb import WandBTracker

logger = logging.getLogger(__name__)

LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "aim": AimTracker,
    "comet_ml": CometMLTracker,
    "mlflow": MLflowTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
    "jsonl": JSONLTracker,
}
"""Tracker name (``log_with="..."``) -> tracker class; `register_tracker_class()` adds to it."""


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose library is installed (``jsonl`` needs none, so it is always there)."""
    return [
        LoggerType(name)
        for name in LoggerType.list()
        if name != LoggerType.ALL and (name == LoggerType.JSONL or is_backend_available(name))
    ]


class NotATrackerClassError(TypeError, ValueError):
    """``register_tracker_class`` was given something that is not a ``GeneralTracker`` subclass.

    Both a ``TypeError`` (what accel raised first) and a ``ValueError`` (what the documented system
    raises), so code catching either keeps working.
    """


def register_tracker_class(tracker_class: type[GeneralTracker]) -> type[GeneralTracker]:
    """Make a custom tracker usable by name in ``log_with`` (``Accelerator(log_with="my_tracker")``).

    The class must subclass `GeneralTracker` and define ``name`` and ``requires_logging_directory``.
    It is built as ``cls(project_name, logging_dir, **init_kwargs)`` when it requires a directory, else
    ``cls(project_name, **init_kwargs)``. Registering a name again replaces the earlier class (with a
    warning). Returns the class, so it can be used as a decorator.

    Args:
        tracker_class: A subclass of `GeneralTracker` with a unique `name`.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise NotATrackerClassError(
            f"register_tracker_class takes a subclass of GeneralTracker, got {tracker_class!r}."
        )
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{tracker_class.__name__} must define a non-empty string `name` to be registered.")
    if name == LoggerType.ALL:
        raise ValueError('"all" is reserved (it selects every installed tracker); choose another `name`.')
    if not isinstance(getattr(tracker_class, "requires_logging_directory", None), bool):
        raise ValueError(
            f"{tracker_class.__name__} must define `requires_logging_directory = True` or `False` to be registered."
        )
    if name in LOGGER_TYPE_TO_CLASS and LOGGER_TYPE_TO_CLASS[name] is not tracker_class:
        warnings.warn(
            f"Tracker name {name!r} was registered to {LOGGER_TYPE_TO_CLASS[name].__name__}; "
            f"{tracker_class.__name__} replaces it.",
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class
    return tracker_class


def _known_names() -> list[str]:
    return [LoggerType.ALL.value, *LOGGER_TYPE_TO_CLASS]


def _check_directory(name: str, logging_dir: Any) -> None:
    cls = LOGGER_TYPE_TO_CLASS[name]
    if cls.requires_logging_directory and logging_dir is None:
        raise ValueError(
            f"Logging with `{name}` requires a `logging_dir` to be passed in: pass `project_dir=...` to the "
            "Accelerator (or `logging_dir` in its ProjectConfiguration)."
        )


def filter_trackers(
    log_with: str | LoggerType | GeneralTracker | Iterable[str | LoggerType | GeneralTracker] | None,
    logging_dir: str | os.PathLike | None = None,
) -> list[str | GeneralTracker]:
    """What ``log_with`` asks for: tracker names (``str``) and tracker instances, in order, without repeats.

    ``"all"`` (or ``LoggerType.ALL``) adds, after the others, every built-in tracker whose library is installed, and keeps
    the instances and the custom (registered) names given beside it; of those, trackers that need a
    logging directory are left out (with a warning) when ``logging_dir`` is ``None``. A tracker named
    explicitly must be known (built in or registered), installed (else an ImportError naming the extra)
    and, if it needs one, have a ``logging_dir`` (else a ValueError).

    Args:
        log_with: A tracker name, `LoggerType`, tracker instance, or a list of them; `"all"` adds every
            installed tracker.
        logging_dir: The folder trackers that write files need; naming one of them without it is an error.
    """
    if log_with is None:
        return []
    if isinstance(log_with, (str, GeneralTracker)) or not isinstance(log_with, Iterable):
        log_with = [log_with]  # type: ignore[list-item]
    requested = list(log_with)

    result: list[str | GeneralTracker] = []
    names: list[str] = []
    for item in requested:
        if isinstance(item, GeneralTracker):
            if not any(item is other for other in result):
                result.append(item)
            continue
        if isinstance(item, type) and issubclass(item, GeneralTracker):
            raise TypeError(
                f"log_with takes tracker instances or names; got the class {item.__name__}. "
                f"Pass an instance ({item.__name__}(...)) or register it with register_tracker_class."
            )
        if not isinstance(item, str):
            raise TypeError(
                f"log_with entries must be tracker names, LoggerType members or GeneralTracker instances; "
                f"got {type(item).__name__}: {item!r}"
            )
        name = str(item).strip()
        if name.lower() in _known_names():
            name = name.lower()
        if name != LoggerType.ALL and name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"Unsupported tracker {item!r} in log_with. Choose among {_known_names()}.")
        if name in names:
            continue
        names.append(name)
        if name != LoggerType.ALL:
            _check_installed(name)
            _check_directory(name, logging_dir)
            result.append(name)

    if LoggerType.ALL.value in names:
        for member in get_available_trackers():
            name = str(member)
            if name in result:
                continue
            if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
                if name != LoggerType.JSONL:
                    logger.warning(
                        "log_with='all' leaves out %r: it needs a logging directory (pass project_dir=...).", name
                    )
                continue
            result.append(name)
    return result


def _check_installed(name: str) -> None:
    extra = getattr(LOGGER_TYPE_TO_CLASS[name], "extra", "")
    if extra and not is_backend_available(extra):
        raise ImportError(
            f"log_with asks for {name!r}, whose library is not installed: {install_hint('accel-tracking', extra)}"
        )

"""Calling several trackers as one: each gets its turn even when another fails, and failures name the tracker.

``Accelerator.log`` / ``end_training`` call `log_to_all()` / `finish_all()`: a tracker that raises
does not keep the values from the trackers after it, and the error raised at the end says which
tracker(s) failed and why (the first failure is chained as ``__cause__``).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from accel_tracking.general import GeneralTracker, as_step
from accel_tracking.values import normalize_values

logger = logging.getLogger(__name__)


class TrackerError(RuntimeError):
    """One or more trackers failed in ``action``; ``failures`` maps each tracker's name to its exception.

    Args:
        action: What was being done (`start`, `log`, `finish`, ...).
        failures: Name of each failed tracker -> its exception.
        succeeded: Names of the trackers that did not fail.
    """

    def __init__(self, action: str, failures: dict[str, BaseException], succeeded: list[str]) -> None:
        self.action = action
        self.failures = failures
        self.succeeded = succeeded
        lines = [f"{len(failures)} tracker(s) failed in {action}: {', '.join(failures)}"]
        for name, error in failures.items():
            lines.append(f"  - {name}: {type(error).__name__}: {error}")
        if succeeded:
            lines.append(f"These trackers completed {action}: {', '.join(succeeded)}.")
        super().__init__("\n".join(lines))


def tracker_label(tracker: Any, taken: Iterable[str] = ()) -> str:
    """The name a failure is reported under: ``tracker.name`` (made unique with ``#2``... among ``taken``)."""
    base = str(getattr(tracker, "name", None) or type(tracker).__name__)
    label, index = base, 1
    taken = set(taken)
    while label in taken:
        index += 1
        label = f"{base}#{index}"
    return label


def _run_all(action: str, trackers: Iterable[Any], call: Any, raise_errors: bool) -> dict[str, BaseException]:
    failures: dict[str, BaseException] = {}
    succeeded: list[str] = []
    for tracker in trackers:
        label = tracker_label(tracker, [*failures, *succeeded])
        try:
            call(tracker)
        except Exception as error:  # each tracker is isolated from the others
            failures[label] = error
            logger.error("Tracker %s failed in %s:\n%s", label, action, "".join(traceback.format_exception(error)))
        else:
            succeeded.append(label)
    if failures and raise_errors:
        raise TrackerError(action, failures, succeeded) from next(iter(failures.values()))
    return failures


def log_to_all(
    trackers: Iterable[GeneralTracker],
    values: Mapping[str, Any],
    step: int | None = None,
    log_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    raise_errors: bool = True,
) -> dict[str, BaseException]:
    """Log ``values`` at ``step`` to every tracker; ``log_kwargs[tracker.name]`` are that tracker's extra kwargs.

    Tensors and numpy scalars are turned into numbers once, and each tracker receives its own copy of
    the values. A tracker that raises is skipped and the others still log; at the end a
    `TrackerError` names every failed tracker (``raise_errors=False``: the failures are logged
    and returned instead). Returns ``{tracker name: exception}`` for the failures (empty when all logged).

    Args:
        trackers: The trackers (started `GeneralTracker` instances).
        values: Name -> value to log.
        step: The step these values belong to; `None` lets the backend count.
        log_kwargs: Tracker name -> extra keyword arguments of that tracker's `log`.
        raise_errors: Raise a `TrackerError` after all trackers ran when one failed; `False` returns the
            failures instead.
    """
    step = as_step(step)  # a bad step fails here, before any tracker logged
    clean = normalize_values(values)
    per_tracker = log_kwargs or {}
    if not isinstance(per_tracker, Mapping):
        raise TypeError(
            f"log_kwargs must map a tracker name to its keyword arguments, e.g. {{'wandb': {{'commit': True}}}}; "
            f"got {type(per_tracker).__name__}"
        )

    def call(tracker: Any) -> None:
        extra = per_tracker.get(getattr(tracker, "name", ""), {})
        tracker.log(dict(clean), step=step, **extra)

    return _run_all("log", trackers, call, raise_errors)


def store_config_to_all(
    trackers: Iterable[GeneralTracker], config: Mapping[str, Any], raise_errors: bool = True
) -> dict[str, BaseException]:
    """``store_init_configuration(config)`` on every tracker, with the same isolation as `log_to_all()`.

    Args:
        trackers: The trackers (started `GeneralTracker` instances).
        config: The hyper-parameters to store.
        raise_errors: Raise a `TrackerError` after all trackers ran when one failed; `False` returns the
            failures instead.
    """
    return _run_all("store_init_configuration", trackers, lambda t: t.store_init_configuration(config), raise_errors)


def start_all(trackers: Iterable[GeneralTracker], raise_errors: bool = True) -> dict[str, BaseException]:
    """``start()`` on every tracker (those without one are skipped), isolated like `log_to_all()`.

    Args:
        trackers: The trackers (started `GeneralTracker` instances).
        raise_errors: Raise a `TrackerError` after all trackers ran when one failed; `False` returns the
            failures instead.
    """

    def call(tracker: Any) -> None:
        start = getattr(tracker, "start", None)
        if callable(start):
            start()

    return _run_all("start", trackers, call, raise_errors)


def finish_all(trackers: Iterable[GeneralTracker], raise_errors: bool = True) -> dict[str, BaseException]:
    """``finish()`` on every tracker: all are finished even when one fails; then a `TrackerError`.

    The built-in trackers' ``finish`` is idempotent, so calling this twice is harmless.

    Args:
        trackers: The trackers (started `GeneralTracker` instances).
        raise_errors: Raise a `TrackerError` after all trackers ran when one failed; `False` returns the
            failures instead.
    """
    return _run_all("finish", trackers, lambda t: t.finish(), raise_errors)

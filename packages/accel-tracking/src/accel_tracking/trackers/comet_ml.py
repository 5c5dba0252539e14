"""Comet. ``COMET_MODE=offline`` (or ``online=False``) writes an ``OfflineExperiment`` archive for ``comet upload``."""

from __future__ import annotations

import os
import sys
from typing import Any

from accel_state.environment import str_to_bool
from accel_tracking.general import BackendTracker
from accel_tracking.values import is_number


class CometMLTracker(BackendTracker):
    """Logs to a Comet experiment created with ``comet_ml.start(project_name=run_name, **kwargs)``.

    For an offline run (``online=False``, ``mode="offline"`` or ``COMET_OFFLINE=true``) Comet's error
    reporting to its servers is switched off (``COMET_ERROR_TRACKING_ENABLE=false``) unless set otherwise.

    The config is logged with ``log_parameters`` (Comet flattens nested dicts itself). Numbers are
    metrics, strings go to ``log_other`` and dicts of numbers to ``log_metrics``. ``tracker`` is the
    Comet experiment.

    Args:
        run_name: the Comet project.
        **kwargs: passed to ``comet_ml.start`` (``workspace``, ``online``, ``mode``, ``experiment_config``, ...).
    """

    name = "comet_ml"
    requires_logging_directory = False
    extra = "comet_ml"
    library = "comet_ml"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)

    def _offline(self) -> bool:
        kwargs = self.init_kwargs
        mode = str(kwargs.get("mode") or os.environ.get("COMET_START_MODE") or "").lower()
        env_offline = str_to_bool(os.environ.get("COMET_OFFLINE", "false") or "false")
        return kwargs.get("online") is False or mode == "offline" or bool(env_offline)

    def _start(self) -> Any:
        if self._offline() and "comet_ml" not in sys.modules:
            # An offline run should not reach the network: Comet's error reporting (read at import) would.
            os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
        comet_ml = self._import("comet_ml")
        kwargs = dict(self.init_kwargs)
        if "project" not in kwargs:
            kwargs.setdefault("project_name", self.run_name)
        return comet_ml.start(**kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.log_parameters(config)

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        if step is not None:
            self._run.set_step(step)
        for key, value in values.items():
            if is_number(value) or isinstance(value, bool):
                self._run.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self._run.log_other(key, value)
            elif isinstance(value, dict):
                self._run.log_metrics(value, prefix=key, step=step, **kwargs)
            else:
                self._skip(key, value, "numbers, strings and dicts of numbers")

    def _finish(self) -> None:
        self._run.end()

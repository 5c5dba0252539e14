"""Aim, writing a local repository (or a remote one given as ``aim://host:port``)."""

from __future__ import annotations

import os
from typing import Any

from accel_tracking.general import BackendTracker, on_main_process
from accel_tracking.values import is_number


class AimTracker(BackendTracker):
    """Logs to an ``aim.Run`` in the repository ``logging_dir`` (``tracker`` is that run).

    The config is stored unchanged as the run's ``hparams`` (Aim keeps nested dicts, lists and None).
    Numbers are tracked as metrics, strings as ``aim.Text``. Runs appear in ``aim up`` (which indexes
    the repository when it starts).

    Args:
        run_name: the run's name.
        logging_dir: the Aim repository (created when missing); default the current directory.
        **kwargs: passed to ``aim.Run`` (``experiment``, ``system_tracking_interval``, ...).
    """

    name = "aim"
    requires_logging_directory = True
    extra = "aim"
    library = "aim"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = ".", **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self.logging_dir = os.fspath(logging_dir) if logging_dir is not None else "."

    def _start(self) -> Any:
        aim = self._import("aim")
        if "://" not in self.logging_dir:
            os.makedirs(self.logging_dir, exist_ok=True)
        run = aim.Run(repo=self.logging_dir, **self.init_kwargs)
        run.name = str(self.run_name)
        return run

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run["hparams"] = config

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        aim = self._import("aim")
        for key, value in values.items():
            if is_number(value) or isinstance(value, bool):
                self._run.track(value, name=key, step=step, **kwargs)
            elif isinstance(value, str):
                self._run.track(aim.Text(value), name=key, step=step, **kwargs)
            else:
                self._skip(key, value, "numbers and strings")

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Track images (``name -> image`` or ``name -> (image, caption)``) as ``aim.Image``.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        aim = self._import("aim")
        run = self._ensure_started()
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            run.track(aim.Image(image, caption=caption), name=key, step=step, **kwargs)

    def _finish(self) -> None:
        self._run.close()

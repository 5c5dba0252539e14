"""SwanLab. ``mode="offline"`` (or ``"local"``) keeps the run on disk under ``log_dir`` for ``swanlab sync``."""

from __future__ import annotations

from typing import Any

from accel_tracking.general import BackendTracker, on_main_process


def _none_as_text(value: Any) -> Any:
    # SwanLab stores None config values as {}: keep the meaning by writing "None".
    if value is None:
        return "None"
    if isinstance(value, dict):
        return {k: _none_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_none_as_text(v) for v in value]
    return value


class SwanLabTracker(BackendTracker):
    """Logs to a run created with ``swanlab.init(project=run_name, **kwargs)`` (``tracker`` is that run).

    The config keeps its nesting (``None`` values are written as ``"None"``, which SwanLab would turn
    into an empty dict).

    Args:
        run_name: the SwanLab project.
        **kwargs: passed to ``swanlab.init`` (``name``, ``mode``, ``log_dir``, ``workspace``, ...).
    """

    name = "swanlab"
    requires_logging_directory = False
    extra = "swanlab"
    library = "swanlab"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)

    def _start(self) -> Any:
        swanlab = self._import("swanlab")
        return swanlab.init(project=self.run_name, **self.init_kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.config.update(_none_as_text(config))

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        self._run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log images (``name -> image or list of images``) as ``swanlab.Image``; ``kwargs`` go to ``swanlab.Image``.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        swanlab = self._import("swanlab")
        run = self._ensure_started()
        logged = {}
        for key, images in values.items():
            many = images if isinstance(images, list) else [images]
            logged[key] = [swanlab.Image(image, **kwargs) for image in many]
        run.log(logged, step=step)

    def _finish(self) -> None:
        finish = getattr(self._run, "finish", None)
        if callable(finish):
            finish()
        else:
            self._import("swanlab").finish()

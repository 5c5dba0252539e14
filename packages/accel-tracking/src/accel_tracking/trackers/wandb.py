"""Weights & Biases. Offline runs (``WANDB_MODE=offline``) are written under ``dir``/wandb for ``wandb sync``."""

from __future__ import annotations

from typing import Any

from accel_tracking.general import BackendTracker, on_main_process


class WandBTracker(BackendTracker):
    """Logs to a wandb run created with ``wandb.init(project=run_name, **kwargs)``.

    The config is stored with its nesting (wandb keeps nested dicts and lists). ``tracker`` is the
    ``wandb.Run``.

    Args:
        run_name: the wandb project.
        **kwargs: passed to ``wandb.init`` (``entity``, ``name``, ``dir``, ``mode``, ``tags``, ...).
    """

    name = "wandb"
    requires_logging_directory = False
    extra = "wandb"
    library = "wandb"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)

    def _start(self) -> Any:
        wandb = self._import("wandb")
        return wandb.init(project=self.run_name, **self.init_kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.config.update(config, allow_val_change=True)

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        self._run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log images (``name -> list of images``; each an array, tensor or PIL image). ``kwargs`` go to ``wandb.Image``.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        wandb = self._import("wandb")
        run = self._ensure_started()
        run.log({key: [wandb.Image(image, **kwargs) for image in images] for key, images in values.items()}, step=step)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Log a ``wandb.Table`` built from ``columns`` and ``data`` rows, or from a pandas ``dataframe``.

        Args:
            table_name: Name of the table in the run.
            columns: Column names (with `data`).
            data: Rows of the table, each a list of values (with `columns`).
            dataframe: A pandas `DataFrame` to log instead of `columns` and `data`.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        wandb = self._import("wandb")
        run = self._ensure_started()
        table = wandb.Table(columns=columns, data=data, dataframe=dataframe, **kwargs)
        run.log({table_name: table}, step=step)

    def _finish(self) -> None:
        self._run.finish()

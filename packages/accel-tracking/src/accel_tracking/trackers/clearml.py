"""ClearML, online or in offline mode (``CLEARML_OFFLINE_MODE=1`` or ``Task.set_offline(True)``)."""

from __future__ import annotations

import os
from typing import Any

from accel_state.environment import str_to_bool
from accel_tracking.general import BackendTracker, on_main_process
from accel_tracking.values import is_number, scalar_config

_SPLIT_PREFIXES = ("train", "eval", "test", "val", "validation")


def title_and_series(key: str) -> tuple[str, str]:
    """ClearML's (title, series) for a metric name: ``"eval_loss" -> ("eval", "loss")``, ``"a/b" -> ("a", "b")``."""
    if "/" in key:
        title, series = key.split("/", 1)
        return title, series
    for prefix in _SPLIT_PREFIXES:
        for sep in ("_", "-"):
            if key.startswith(prefix + sep) and len(key) > len(prefix) + 1:
                return prefix, key[len(prefix) + 1 :]
    return key, key


def _env_offline() -> bool:
    value = os.environ.get("CLEARML_OFFLINE_MODE") or os.environ.get("TRAINS_OFFLINE_MODE") or ""
    return bool(value) and bool(str_to_bool(value))


class ClearMLTracker(BackendTracker):
    """Logs to a ClearML task (``tracker`` is the ``clearml.Task``).

    An existing current task is reused; otherwise ``Task.init`` creates one with ``project_name`` and
    ``task_name`` from ``CLEARML_PROJECT`` / ``CLEARML_TASK`` or the run name. Offline mode is honoured
    even when ``CLEARML_OFFLINE_MODE`` was set after clearml was imported, and offline reports are
    written without ClearML's reporting subprocess (whose shutdown otherwise adds seconds to ``finish``).

    The config is stored whole as the task's configuration object and, flattened (``a/b`` keys, lists
    and ``None`` as text), as its hyper-parameters. Numbers are reported as scalars: with a step under
    the (title, series) of `title_and_series()`, without one as single values.

    Args:
        run_name: the project and task name (unless given in ``kwargs`` or the environment).
        **kwargs: passed to ``Task.init`` (``project_name``, ``task_name``, ``tags``, ``output_uri``, ...).
    """

    name = "clearml"
    requires_logging_directory = False
    extra = "clearml"
    library = "clearml"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)

    def _start(self) -> Any:
        Task = self._import("clearml").Task
        if _env_offline() and not Task.is_offline():
            Task.set_offline(True)
        if Task.is_offline():
            Task._report_subprocess_enabled = False
        current = Task.current_task()
        self._owns_task = current is None
        if current is not None:
            return current
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.run_name))
        kwargs.setdefault("task_name", os.environ.get("CLEARML_TASK", self.run_name))
        return Task.init(**kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.connect_configuration(config, name="config")
        self._run.connect(scalar_config(config), name="hyperparameters")

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        logger = self._run.get_logger()
        for key, value in values.items():
            if isinstance(value, bool):
                value = int(value)
            if not is_number(value):
                self._skip(key, value, "numbers only (ClearML scalars)")
                continue
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = title_and_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Report images (``name -> numpy array or PIL image``) with ``Logger.report_image``.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        task = self._ensure_started()
        logger = task.get_logger()
        for key, image in values.items():
            title, series = title_and_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

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
        """Report a table from a pandas ``dataframe`` or from ``columns`` and ``data`` rows.

        Args:
            table_name: Name of the table in the run.
            columns: Column names (with `data`).
            data: Rows of the table, each a list of values (with `columns`).
            dataframe: A pandas `DataFrame` to log instead of `columns` and `data`.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        task = self._ensure_started()
        if dataframe is None:
            if data is None:
                raise ValueError("log_table needs `data` rows (with `columns`) or a `dataframe`.")
            table = [list(columns)] + [list(row) for row in data] if columns is not None else data
        else:
            table = dataframe
        title, series = title_and_series(table_name)
        task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    def _finish(self) -> None:
        if getattr(self, "_owns_task", True):
            self._run.close()
        else:  # a task the user created is theirs to close
            self._run.flush(wait_for_uploads=True)

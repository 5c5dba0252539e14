"""MLflow, on any tracking store; a local directory becomes a file store that works without extra setup."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from accel_state.environment import str_to_bool
from accel_tracking.general import BackendTracker, on_main_process
from accel_tracking.values import is_number, string_config

logger = logging.getLogger(__name__)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracking_uri_for(logging_dir: str | os.PathLike | None) -> str | None:
    """The MLflow tracking URI for ``logging_dir``: a URI is kept, a local path becomes ``file://<abs path>``."""
    if logging_dir is None:
        return None
    text = os.fspath(logging_dir)
    if _SCHEME.match(text) and not re.match(r"^[A-Za-z]:[\\/]", text):  # a URI, not a Windows drive
        return text
    return "file://" + os.path.abspath(text)


def is_file_store(uri: str | None) -> bool:
    """True when ``uri`` names MLflow's file store (a plain path or a ``file:`` URI)."""
    return uri is not None and (uri.startswith("file:") or not _SCHEME.match(uri))


class MLflowTracker(BackendTracker):
    """Logs to an MLflow run (``tracker`` is the ``mlflow.ActiveRun``).

    The environment variables ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``,
    ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN`` take priority over the matching arguments. When the
    store is a local directory (MLflow's file store), ``MLFLOW_ALLOW_FILE_STORE=true`` is set for this
    process, which recent MLflow releases otherwise require.

    The config is stored as run parameters (nested keys flattened as ``a/b``, every value as text, values
    longer than MLflow's limit truncated) and, unchanged, as the artifact ``config.json``. Numbers are
    logged as metrics; other values are skipped with a warning (MLflow metrics are numbers only).

    Args:
        experiment_name: the experiment (created when missing); the ``project_name`` of ``init_trackers``.
        logging_dir: tracking store: a local directory or a tracking URI (default: MLflow's own default).
        run_id: resume that run instead of starting a new one.
        tags: tags of the run (a dict, or its JSON text).
        nested_run: start the run nested in the active one.
        run_name: the run's name.
        description: the run's description.
        **kwargs: Passed on to `mlflow.start_run`.
    """

    name = "mlflow"
    requires_logging_directory = False
    extra = "mlflow"
    library = "mlflow"

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | str = False,
        run_name: str | None = None,
        description: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(run_name, **kwargs)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking_uri_for(logging_dir)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags_value: Any = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags_value, str):
            try:
                tags_value = json.loads(tags_value)
            except json.JSONDecodeError as error:
                raise ValueError(f"MLflow tags must be a dict or its JSON text, got {tags_value!r}: {error}") from None
        if tags_value is not None and not isinstance(tags_value, dict):
            raise ValueError(f"MLflow tags must be a dict (or its JSON text), got {type(tags_value).__name__}")
        self.tags = {str(k): str(v) for k, v in (tags_value or {}).items()}
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = bool(str_to_bool(nested)) if isinstance(nested, str) else bool(nested)
        self.description = description

    def _start(self) -> Any:
        mlflow = self._import("mlflow")
        uri = self.tracking_uri
        if is_file_store(uri if uri is not None else mlflow.get_tracking_uri()):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if uri is not None:
            mlflow.set_tracking_uri(uri)
        experiment_id = None
        if self.experiment_name:
            found = mlflow.get_experiment_by_name(self.experiment_name)
            if found is not None:
                experiment_id = found.experiment_id
            else:
                experiment_id = mlflow.create_experiment(self.experiment_name, tags=self.tags or None)
        return mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags or None,
            description=self.description,
            **self.init_kwargs,
        )

    def _store_config(self, config: dict[str, Any]) -> None:
        mlflow = self._import("mlflow")
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = string_config(config)
        for key, value in params.items():
            if len(value) > MAX_PARAM_VAL_LENGTH:
                logger.warning(
                    "MLflow keeps parameter values of at most %d characters: %r is truncated "
                    "(the full value is in the artifact config.json).",
                    MAX_PARAM_VAL_LENGTH,
                    key,
                )
                params[key] = value[:MAX_PARAM_VAL_LENGTH]
        items = list(params.items())
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(items[start : start + MAX_PARAMS_TAGS_PER_BATCH]), run_id=self._run.info.run_id)
        mlflow.log_dict(config, "config.json", run_id=self._run.info.run_id)

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        mlflow = self._import("mlflow")
        metrics = {}
        for key, value in values.items():
            if is_number(value) or isinstance(value, bool):
                metrics[key] = float(value)
            else:
                self._skip(key, value, "numbers only (MLflow metrics)")
        if metrics:
            mlflow.log_metrics(metrics, step=step, run_id=self._run.info.run_id, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib or plotly ``figure`` as the run's artifact ``artifact_file``.

        Args:
            figure: A matplotlib or plotly figure.
            artifact_file: Its file name in the run's artifacts.
            save_kwargs: Passed on to `mlflow.log_figure`.
        """
        self._ensure_started()
        self._import("mlflow").log_figure(figure, artifact_file, save_kwargs=save_kwargs or None)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy every file of ``local_dir`` into the run's artifacts (under ``artifact_path``).

        Args:
            local_dir: The folder whose files are copied.
            artifact_path: Folder inside the run's artifacts; `None` puts the files at their top.
        """
        self._ensure_started()
        self._import("mlflow").log_artifacts(local_dir, artifact_path=artifact_path, run_id=self._run.info.run_id)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``).

        Args:
            local_path: The file to copy.
            artifact_path: Folder inside the run's artifacts; `None` puts the files at their top.
        """
        self._ensure_started()
        self._import("mlflow").log_artifact(local_path, artifact_path=artifact_path, run_id=self._run.info.run_id)

    def _finish(self) -> None:
        mlflow = self._import("mlflow")
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self._run.info.run_id:
            mlflow.end_run()
        else:
            mlflow.MlflowClient().set_terminated(self._run.info.run_id)

"""TensorBoard, through PyTorch's ``SummaryWriter`` (or tensorboardX when only that is installed)."""

from __future__ import annotations

import os
import time
from typing import Any

from accel_state.install_hints import install_hint
from accel_tracking.general import BackendTracker, on_main_process
from accel_tracking.values import is_number, scalar_config

#: The file the run configuration is written to, in a folder of its own under the run's directory.
HPARAMS_FILE = "hparams.yml"


def _import_yaml() -> Any:
    """PyYAML, which writes ``hparams.yml``; part of the ``tensorboard`` extra."""
    try:
        import yaml
    except ImportError as error:
        raise ImportError(
            "The tensorboard tracker writes the run configuration to hparams.yml with PyYAML, which is not "
            f"installed: {install_hint('accel-tracking', 'tensorboard')}"
        ) from error
    return yaml


class TensorBoardTracker(BackendTracker):
    """Writes TensorBoard event files into ``<logging_dir>/<run_name>``.

    The config goes to TensorBoard's HParams tab in the same event file (nested keys flattened as
    ``a/b``, lists and ``None`` as text) and, unchanged, to ``<logging_dir>/<run_name>/<time>/hparams.yml``
    (YAML, keys sorted; ``<time>`` is ``time.time()`` when it is stored), the file and place
    Hugging Face Accelerate writes it to. Numbers are logged with ``add_scalar``, strings with ``add_text`` and
    dicts of numbers with ``add_scalars``.

    Args:
        run_name: the run's name (a sub-directory of ``logging_dir``).
        logging_dir: where the run's directory is created.
        **kwargs: passed to ``SummaryWriter`` (``flush_secs``, ``max_queue``, ...).
    """

    name = "tensorboard"
    requires_logging_directory = True
    extra = "tensorboard"
    library = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        if logging_dir is None:
            raise ValueError("The tensorboard tracker writes into a directory: pass `logging_dir` (project_dir=...).")
        super().__init__(run_name, **kwargs)
        self.logging_dir = os.path.join(os.fspath(logging_dir), str(run_name))

    def _start(self) -> Any:
        try:
            writer_cls = self._import("torch.utils.tensorboard").SummaryWriter
        except ImportError:  # tensorboardX alone also writes the same event files
            writer_cls = self._import("tensorboardX").SummaryWriter
        return writer_cls(self.logging_dir, **self.init_kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        yaml = _import_yaml()  # before anything is written: a missing PyYAML leaves no half-stored config
        flat = scalar_config(config)
        try:
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            from tensorboardX.summary import hparams  # type: ignore[no-redef]
        for summary in hparams(flat, {}):
            self._run.file_writer.add_summary(summary)
        self._run.flush()
        folder = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, HPARAMS_FILE), "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)  # config is plain data (normalize_config): safe_dump always takes it

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        for key, value in values.items():
            if is_number(value) or isinstance(value, bool):
                self._run.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self._run.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict) and all(is_number(v) for v in value.values()):
                self._run.add_scalars(key, value, global_step=step, **kwargs)
            else:
                self._skip(key, value, "numbers, strings and dicts of numbers")
        self._run.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log batches of images (``name -> tensor/array of shape (N, C, H, W)``; ``dataformats=`` to change it).

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        self._ensure_started()
        for key, value in values.items():
            self._run.add_images(key, value, global_step=step, **kwargs)
        self._run.flush()

    def _finish(self) -> None:
        self._run.close()

"""Trackio, a local-first tracker: runs go to a SQLite database per project in its directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from accel_tracking.general import BackendTracker


def point_trackio_at(directory: str | os.PathLike) -> None:
    """Make an already imported trackio write under ``directory``.

    Trackio reads ``TRACKIO_DIR`` once, at import, and copies it into several of its modules; a
    directory chosen later (by ``TRACKIO_DIR`` set after the import, or by ``logging_dir``) would be
    ignored. This re-points every copy.
    """
    new_root = Path(directory)
    utils = sys.modules.get("trackio.utils")
    if utils is None:
        os.environ["TRACKIO_DIR"] = str(new_root)
        return
    old_root = Path(utils.TRACKIO_DIR)
    if old_root == new_root:
        return
    renamed = {"TRACKIO_DIR": new_root, "MEDIA_DIR": new_root / "media", "ARTIFACTS_DIR": new_root / "artifacts"}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "trackio" or name.startswith("trackio.")):
            continue
        for attr, value in renamed.items():
            current = getattr(module, attr, None)
            if isinstance(current, Path) and current == old_root / Path(value).relative_to(new_root):
                setattr(module, attr, value)
    os.environ["TRACKIO_DIR"] = str(new_root)


class TrackioTracker(BackendTracker):
    """Logs to a run created with ``trackio.init(project=run_name, **kwargs)`` (``tracker`` is that run).

    Runs are stored locally (``TRACKIO_DIR``, default trackio's cache) unless ``space_id`` / ``server_url``
    is given. The directory is honoured even when ``TRACKIO_DIR`` is set after trackio was imported.

    Args:
        run_name: the Trackio project.
        logging_dir: store the project's database in this directory (sets ``TRACKIO_DIR``).
        **kwargs: passed to ``trackio.init`` (``name``, ``group``, ``space_id``, ``resume``, ...).
    """

    name = "trackio"
    requires_logging_directory = False
    extra = "trackio"
    library = "trackio"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self.logging_dir = os.fspath(logging_dir) if logging_dir is not None else None

    def _start(self) -> Any:
        directory = self.logging_dir or os.environ.get("TRACKIO_DIR")
        if directory:
            os.environ["TRACKIO_DIR"] = directory  # read by a first import
        trackio = self._import("trackio")
        if directory:
            point_trackio_at(directory)
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("embed", False)
        return trackio.init(project=self.run_name, **kwargs)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.config.update(config)

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        self._run.log(values, step=step, **kwargs)

    def _finish(self) -> None:
        self._run.finish()

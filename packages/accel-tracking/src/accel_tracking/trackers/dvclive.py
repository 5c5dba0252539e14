"""DVCLive: metrics, params and plots as plain files (``dvclive/`` by default), DVC experiments when in a DVC repo."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from accel_tracking.general import BackendTracker
from accel_tracking.values import is_number

_PATCH_LOCK = threading.Lock()


def git_repo_without_commits(start: str | os.PathLike | None = None) -> bool:
    """True when ``start`` (default: the current directory) is inside a git repository that has no commit yet.

    DVCLive fails in such a repository ("Empty git repo"); reading the files is enough to tell, with no git.
    """
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        dot_git = folder / ".git"
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
            if not text.startswith("gitdir:"):
                return False
            git_dir = (folder / text.split(":", 1)[1].strip()).resolve()
        elif dot_git.is_dir():
            git_dir = dot_git
        else:
            continue
        head_file = git_dir / "HEAD"
        if not head_file.is_file():
            return False
        head = head_file.read_text(encoding="utf-8", errors="replace").strip()
        if not head.startswith("ref:"):
            return False  # detached HEAD: a commit exists
        ref = head.split(":", 1)[1].strip()
        common = git_dir
        commondir = git_dir / "commondir"
        if commondir.is_file():
            common = (git_dir / commondir.read_text(encoding="utf-8").strip()).resolve()
        if (git_dir / ref).is_file() or (common / ref).is_file():
            return False
        packed = common / "packed-refs"
        packed_refs = packed.read_text(encoding="utf-8").splitlines() if packed.is_file() else []
        return not any(line.split(" ", 1)[-1].strip() == ref for line in packed_refs)
    return False


class DVCLiveTracker(BackendTracker):
    """Logs through a ``dvclive.Live`` (``tracker`` is it).

    Inside a git repository with no commit, DVCLive's own repository handling fails; the tracker then
    creates ``Live`` without the repository (plain files, no DVC experiment), as it does outside git.

    The config is logged with ``log_params`` (nesting kept). Numbers are logged with ``log_metric``;
    each ``log`` call is one DVCLive step (``step`` sets it).

    Args:
        run_name: unused by DVCLive (kept for the common tracker signature).
        live: an existing ``dvclive.Live`` to log to, instead of creating one.
        **kwargs: passed to ``dvclive.Live`` (``dir``, ``resume``, ``report``, ``save_dvc_exp``, ...).
    """

    name = "dvclive"
    requires_logging_directory = False
    extra = "dvclive"
    library = "dvclive"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self._given_live = live

    def _start(self) -> Any:
        if self._given_live is not None:
            return self._given_live
        dvclive = self._import("dvclive")
        if not git_repo_without_commits():
            return dvclive.Live(**self.init_kwargs)
        live_module = self._import("dvclive.live")
        with _PATCH_LOCK:
            original = live_module.get_dvc_repo
            live_module.get_dvc_repo = lambda: None
            try:
                return dvclive.Live(**self.init_kwargs)
            finally:
                live_module.get_dvc_repo = original

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.log_params(config)

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        if step is not None:
            self._run.step = step
        for key, value in values.items():
            if is_number(value) or isinstance(value, bool):
                self._run.log_metric(key, value, **kwargs)
            else:
                self._skip(key, value, "numbers only (DVCLive metrics)")
        self._run.next_step()

    def _finish(self) -> None:
        self._run.end()

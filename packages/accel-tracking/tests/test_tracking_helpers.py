"""Pure helpers of the backend trackers (no backend library needed)."""

from __future__ import annotations

import os

from accel_tracking.trackers.clearml import title_and_series
from accel_tracking.trackers.dvclive import git_repo_without_commits
from accel_tracking.trackers.mlflow import is_file_store, tracking_uri_for


def test_mlflow_tracking_uri_for_paths_and_uris(tmp_path) -> None:
    assert tracking_uri_for(None) is None
    assert tracking_uri_for(tmp_path) == f"file://{tmp_path}"
    assert tracking_uri_for("runs") == "file://" + os.path.abspath("runs")
    assert tracking_uri_for("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    assert tracking_uri_for("http://host:5000") == "http://host:5000"
    assert is_file_store("file:///x") and is_file_store("/tmp/x") and is_file_store("./mlruns")
    assert not is_file_store("sqlite:///x.db") and not is_file_store("databricks://profile")
    assert not is_file_store(None)


def test_clearml_title_and_series() -> None:
    assert title_and_series("eval_loss") == ("eval", "loss")
    assert title_and_series("train-acc") == ("train", "acc")
    assert title_and_series("loss") == ("loss", "loss")
    assert title_and_series("metrics/f1") == ("metrics", "f1")
    assert title_and_series("train_") == ("train_", "train_")


def _git_dir(root, head: str = "ref: refs/heads/main") -> None:
    (root / ".git" / "refs" / "heads").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text(head + "\n")


def test_git_repo_without_commits(tmp_path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not git_repo_without_commits(plain)

    empty = tmp_path / "empty"
    _git_dir(empty)
    (empty / "sub").mkdir()
    assert git_repo_without_commits(empty / "sub")

    committed = tmp_path / "committed"
    _git_dir(committed)
    (committed / ".git" / "refs" / "heads" / "main").write_text("0" * 40 + "\n")
    assert not git_repo_without_commits(committed)

    packed = tmp_path / "packed"
    _git_dir(packed)
    (packed / ".git" / "packed-refs").write_text("# pack-refs\n" + "1" * 40 + " refs/heads/main\n")
    assert not git_repo_without_commits(packed)

    detached = tmp_path / "detached"
    _git_dir(detached, head="2" * 40)
    assert not git_repo_without_commits(detached)

    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {empty / '.git'}\n")
    assert git_repo_without_commits(worktree)

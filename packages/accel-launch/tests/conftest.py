"""Shared fixtures of accel-launch's tests: an isolated config home and a way to run the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_helpers import run_cli


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME pointed at an empty folder, so no real user config is read or written."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return home


@pytest.fixture
def cli():
    return run_cli

"""Helpers for end-to-end tests: run the real ``accel`` command (or a script) in a subprocess."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_command(
    args: list[str], timeout: float = 300, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``args`` with this interpreter's environment (plus ``env``); output captured as text."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd, check=False)


def accel_command() -> list[str]:
    """How to call the ``accel`` CLI from this interpreter."""
    return [sys.executable, "-m", "accel_launch.cli"]


@pytest.fixture
def run() -> object:
    return run_command

"""Helpers of accel-launch's tests (a module with a unique name, importable from every test file)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: str | None = None,
    module: str = "accel_launch.cli",
) -> subprocess.CompletedProcess:
    """``python -m accel_launch.cli ARGS`` in a subprocess (output captured as text)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        check=False,
    )

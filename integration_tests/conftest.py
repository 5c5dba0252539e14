"""Helpers for end-to-end tests: run the real ``accel`` command (or a script) in a subprocess, signal a
running launch once its job has taken some steps, and compare the results of ``faults_job.py`` runs."""

from __future__ import annotations

import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from accel_state.testing import free_port  # noqa: F401  (the tests import it from here)

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Set by ``nox -s slow`` (before a release): the cases marked ``release`` run too.
RELEASE_TESTS = os.environ.get("ACCEL_RELEASE_TESTS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, with the reason, the cases marked ``release`` unless ``ACCEL_RELEASE_TESTS=1``.

    Such a case repeats what another case of CI covers, on another process count or variant (each
    marker says which case covers it); CI's time goes to the cases that cover something alone.
    """
    if RELEASE_TESTS:
        return
    for item in items:
        marker = item.get_closest_marker("release")
        if marker is not None:
            covered_by = marker.kwargs.get("covered_by", "another case")
            item.add_marker(pytest.mark.skip(reason=f"release-only (nox -s slow): CI covers it with {covered_by}"))


def _full_env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}


def run_command(
    args: list[str], timeout: float = 300, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``args`` with this interpreter's environment (plus ``env``); output captured as text."""
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=_full_env(env), cwd=cwd, check=False
    )


def signal_after_steps(
    args: list[str],
    steps_file: pathlib.Path,
    min_steps: int,
    sig: signal.Signals,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    exit_timeout: float = 180,
    must_be_running: bool = True,
) -> tuple[int, str]:
    """Start ``args``, send ``sig`` once ``steps_file`` has ``min_steps`` lines, and wait for it to end.

    The job (``faults_job.py`` with ``MARK_STEPS=1``) writes a line to ``steps_file`` per step. The
    command runs with this interpreter's environment plus ``env``; stdout and stderr are read together.
    Whatever happens, the process is killed before returning if it still runs.

    Args:
        args: the command line (the real ``accel launch ...``, or ``srun ...``).
        steps_file: the file the job marks its steps in.
        min_steps: how many steps to wait for before signalling.
        sig: the signal to send (SIGTERM, SIGUSR1 ...).
        env: variables added to the environment.
        timeout: how long to wait for the steps before signalling anyway.
        exit_timeout: how long the process may take to end after the signal.
        must_be_running: fail (AssertionError) when the command ended before the signal was sent.

    Returns:
        ``(returncode, output)``.
    """
    process = subprocess.Popen(args, env=_full_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            if steps_file.exists() and len(steps_file.read_text().splitlines()) >= min_steps:
                break
            time.sleep(0.2)
        if must_be_running:
            assert process.poll() is None, "the job ended before it could be preempted"
        process.send_signal(sig)
        out, _ = process.communicate(timeout=exit_timeout)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out


def final_weights(project: pathlib.Path) -> list[dict[str, torch.Tensor]]:
    """The final weights ``faults_job.py`` wrote in ``project`` (ranks 0 and 1)."""
    return [load_file(str(project / f"final_{rank}.safetensors")) for rank in (0, 1)]


def same_weights(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    """True when two runs' :func:`final_weights` are equal to the bit."""
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def accel_command() -> list[str]:
    """How to call the ``accel`` CLI from this interpreter."""
    return [sys.executable, "-m", "accel_launch.cli"]


def _run_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A folder of this test run that every pytest-xdist worker of it sees (the run's own base folder
    without xdist; with it, the folder above the workers' base folders, made anew for each run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    """The final weights of one uninterrupted ``faults_job.py`` run (``accel launch --cpu --num_processes 2``,
    no fault), which the fault, restart and SLURM tests compare their runs with.

    Launched once per test run, not once per test file: under pytest-xdist the first worker to ask runs it
    (holding a lock) and the others wait for it and read the same files.
    """
    folder = _run_folder(tmp_path_factory) / "uninterrupted-faults-job"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "DONE"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            job = str(ROOT / "integration_tests" / "faults_job.py")
            result = run_command(
                [*accel_command(), "launch", "--cpu", "--num_processes", "2", job, str(folder)], timeout=600
            )
            assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
            done.touch()
    return final_weights(folder)


@pytest.fixture
def run() -> object:
    return run_command

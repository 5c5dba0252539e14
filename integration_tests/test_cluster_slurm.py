"""SLURM end to end with a fake ``srun`` (starts the tasks with the variables SLURM sets) and a fake
``scontrol`` (records a requeue): ``srun python train.py`` with no launcher, ``srun accel launch`` on
two "nodes" filled in from ``SLURM_*``, and a requeue after SIGTERM once the preemption save is done.
Every run is the job of the fault tests (``faults_job.py``), compared with one uninterrupted run.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import ROOT, accel_command, run_command
from safetensors.torch import load_file

JOB = str(ROOT / "integration_tests" / "faults_job.py")
TIMEOUT = 600

FAKE_SRUN = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    tasks, nodes = int(os.environ["FAKE_TASKS"]), int(os.environ["FAKE_NODES"])
    per_node = tasks // nodes
    children = []
    for rank in range(tasks):
        env = dict(os.environ)
        env.update(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_NTASKS=str(tasks), SLURM_NNODES=str(nodes),
                   SLURM_JOB_NUM_NODES=str(nodes), SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node),
                   SLURM_NODEID=str(rank // per_node), SLURM_NTASKS_PER_NODE=str(per_node),
                   SLURM_JOB_NODELIST="localhost", SLURM_STEP_NODELIST="localhost")
        children.append(subprocess.Popen(sys.argv[1:], env=env))

    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    codes = [child.wait() for child in children]
    sys.exit(next((code for code in codes if code), 0))
    """
)

FAKE_SCONTROL = textwrap.dedent(
    """
    import os, sys
    with open(os.environ["FAKE_SCONTROL_LOG"], "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def slurm_bin(tmp_path: pathlib.Path) -> dict[str, str]:
    """A folder with ``srun`` and ``scontrol`` on PATH, and the variables the fakes read."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        path = folder / name
        path.write_text(f"#!{sys.executable}\n{text}")
        path.chmod(0o755)
    return {
        "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "MASTER_PORT": str(_free_port()),
    }


def _final(project: pathlib.Path) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(project / f"final_{rank}.safetensors")) for rank in (0, 1)]


def _same(a: list, b: list) -> bool:
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    project = tmp_path_factory.mktemp("uninterrupted")
    done = run_command(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", JOB, str(project)], timeout=TIMEOUT
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return _final(project)


def test_srun_without_launcher_forms_one_run(tmp_path: pathlib.Path, slurm_bin: dict, uninterrupted: list) -> None:
    env = {**slurm_bin, "FAKE_TASKS": "2", "FAKE_NODES": "1", "ACCELERATE_USE_CPU": "true"}
    done = run_command(["srun", sys.executable, JOB, str(tmp_path)], env=env, timeout=TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert _same(_final(tmp_path), uninterrupted)


def test_srun_accel_launch_two_nodes_requeues_after_the_preemption_save(
    tmp_path: pathlib.Path, slurm_bin: dict, uninterrupted: list
) -> None:
    command = ["srun", *accel_command(), "launch", "--cpu", "--num_processes", "2", "--requeue_on_preemption"]
    dry = run_command(
        [*command, "--dry_run", "--json", JOB, str(tmp_path)], env={**slurm_bin, "FAKE_TASKS": "2", "FAKE_NODES": "2"}
    )
    assert dry.returncode == 0, dry.stderr
    assert '"source": "environment SLURM_NNODES"' in dry.stdout and '"source": "environment SLURM_NODEID"' in dry.stdout
    assert '"value": "localhost"' in dry.stdout and '"source": "environment SLURM_JOB_NODELIST"' in dry.stdout

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **slurm_bin}
    env.update(FAKE_TASKS="2", FAKE_NODES="2", PREEMPT_SAVE="1", SLOW_STEP="0.3", MARK_STEPS="1")
    srun = subprocess.Popen(
        [*command, JOB, str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    steps = tmp_path / "steps.log"
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and srun.poll() is None:
            if steps.exists() and len(steps.read_text().splitlines()) >= 4:
                break
            time.sleep(0.2)
        assert srun.poll() is None, "the job ended before it could be preempted"
        srun.send_signal(signal.SIGTERM)
        out, _ = srun.communicate(timeout=180)
    finally:
        if srun.poll() is None:
            srun.kill()
    assert srun.returncode == 143, out[-4000:]
    assert "preemption requested (SIGTERM)" in out, out[-4000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 4242"]  # once, from machine rank 0
    assert "job requeued (scontrol requeue 4242)" in out

    env.pop("PREEMPT_SAVE"), env.pop("SLOW_STEP")
    again = subprocess.run([*command, JOB, str(tmp_path)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "resumed at batch" in again.stdout + again.stderr
    assert _same(_final(tmp_path), uninterrupted)


def test_sigusr1_to_the_launcher_stops_the_run_like_sigterm(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PREEMPT_SAVE": "1", "SLOW_STEP": "0.3"}
    env["MARK_STEPS"] = "1"
    launcher = subprocess.Popen(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", JOB, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    steps = tmp_path / "steps.log"
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and launcher.poll() is None:
            if steps.exists() and len(steps.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        launcher.send_signal(signal.SIGUSR1)
        out, _ = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 143, out[-4000:]
    assert "preemption requested (SIGTERM)" in out

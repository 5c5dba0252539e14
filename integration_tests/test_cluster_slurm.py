"""SLURM end to end with a fake ``srun`` (starts the tasks with the variables SLURM sets) and a fake
``scontrol`` (records a requeue): ``srun python train.py`` with no launcher, ``srun accel launch`` on
two "nodes" filled in from ``SLURM_*``, and a requeue after SIGTERM once the preemption save is done.
Every run is the job of the fault tests (``faults_job.py``), compared with one uninterrupted run.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import textwrap

import pytest
from conftest import ROOT, accel_command, final_weights, free_port, run_command, same_weights, signal_after_steps

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
        "MASTER_PORT": str(free_port()),
    }


def test_srun_without_launcher_forms_one_run(tmp_path: pathlib.Path, slurm_bin: dict, uninterrupted: list) -> None:
    env = {**slurm_bin, "FAKE_TASKS": "2", "FAKE_NODES": "1", "ACCELERATE_USE_CPU": "true"}
    done = run_command(["srun", sys.executable, JOB, str(tmp_path)], env=env, timeout=TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert same_weights(final_weights(tmp_path), uninterrupted)


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

    env = {
        **slurm_bin,
        "FAKE_TASKS": "2",
        "FAKE_NODES": "2",
        "PREEMPT_SAVE": "1",
        "SLOW_STEP": "0.3",
        "MARK_STEPS": "1",
    }
    code, out = signal_after_steps(
        [*command, JOB, str(tmp_path)], tmp_path / "steps.log", 4, signal.SIGTERM, env=env, timeout=TIMEOUT
    )
    assert code == 143, out[-4000:]
    assert "preemption requested (SIGTERM)" in out, out[-4000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 4242"]  # once, from machine rank 0
    assert "job requeued (scontrol requeue 4242)" in out
    # the preemption save is complete and alone: nothing partial beside it
    stopped_at = int((tmp_path / "steps.log").read_text().splitlines()[-1].split()[1])
    checkpoints = sorted(os.listdir(tmp_path / "checkpoints"), key=lambda name: int(name.split("_")[1]))
    latest = tmp_path / "checkpoints" / checkpoints[-1]
    assert (latest / "accel_checkpoint.json").is_file() and (latest / "model.safetensors").is_file()
    assert not any(name.startswith(".") for name in checkpoints), checkpoints

    env.pop("PREEMPT_SAVE"), env.pop("SLOW_STEP")
    again = run_command([*command, JOB, str(tmp_path)], env=env, timeout=TIMEOUT)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-4000:]
    # both machines stopped at the step under way when SIGTERM came, and kept it (docs/faults.md)
    assert f"resumed at batch {stopped_at}," in text, text[-4000:]
    assert same_weights(final_weights(tmp_path), uninterrupted)


def test_sigusr1_to_the_launcher_stops_the_run_like_sigterm(tmp_path: pathlib.Path) -> None:
    code, out = signal_after_steps(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", JOB, str(tmp_path)],
        tmp_path / "steps.log",
        2,
        signal.SIGUSR1,
        env={"PREEMPT_SAVE": "1", "SLOW_STEP": "0.3", "MARK_STEPS": "1"},
        timeout=TIMEOUT,
        must_be_running=False,
    )
    assert code == 143, out[-4000:]
    assert "preemption requested (SIGTERM)" in out

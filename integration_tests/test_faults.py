"""Faults through the real ``accel launch``: killed workers restarted with an exact resume (one machine
with two processes, and two machines with one process each over loopback), SIGTERM to the launcher
with save_on_preemption (before a release; CI's SLURM requeue test makes that preemption), and a
collective that one rank skips.

Restarts repeat: the one-machine test kills a worker three times in one run (SIGKILL, an exception,
``os._exit(137)``) under ``--max_restarts 3``; the two-machine test kills one machine's worker once.
Every run is compared with one uninterrupted run of the same job (``faults_job.py``).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, accel_command, final_weights, free_port, run_command, same_weights, signal_after_steps

JOB = str(ROOT / "integration_tests" / "faults_job.py")
LAUNCH_TIMEOUT = 600


def _launch(args: list[str], project: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_command([*accel_command(), "launch", "--cpu", *args, JOB, str(project)], timeout=LAUNCH_TIMEOUT, env=env)


def test_killed_workers_restart_and_resume_exactly(tmp_path: pathlib.Path, uninterrupted: list) -> None:
    # Batches 5, 11 and 13 are odd: each death falls between two accumulation steps (accumulation 2),
    # and the checkpoints (every 3 batches) are taken mid-accumulation too.
    faults = "0:1:5:kill,1:0:11:raise,2:1:13:exit"
    done = _launch(["--num_processes", "2", "--max_restarts", "3"], tmp_path, env={"FAULTS": faults})
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    assert "attempt 1: resumed at batch 3" in text  # checkpoint_0 (batch 3) was the latest complete one
    assert "attempt 2: resumed at batch 9" in text
    assert "attempt 3: resumed at batch 12" in text
    assert "DONE attempt 3 batches 16" in text
    assert same_weights(final_weights(tmp_path), uninterrupted)


def test_two_machines_one_killed_both_restart_and_resume_exactly(tmp_path: pathlib.Path, uninterrupted: list) -> None:
    port = free_port()
    common = [
        *accel_command(),
        "launch",
        "--cpu",
        "--num_machines",
        "2",
        "--num_processes",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--rdzv_backend",
        "c10d",
        "--max_restarts",
        "1",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    machines = []
    for machine_rank in (0, 1):
        # Only machine 1's worker dies (once: its agent's restart count is 1 afterwards).
        machine_env = {**env, "FAULTS": "0:*:5:kill"} if machine_rank == 1 else env
        machines.append(
            subprocess.Popen(
                [*common, "--machine_rank", str(machine_rank), JOB, str(tmp_path)],
                env=machine_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for machine in machines:
            out, _ = machine.communicate(timeout=LAUNCH_TIMEOUT)
            outputs.append(out)
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    assert [m.returncode for m in machines] == [0, 0], "\n=====\n".join(o[-4000:] for o in outputs)
    for out in outputs:  # both machines' groups were restarted and loaded checkpoint_0 (batch 3)
        assert "resumed at batch 3" in out, out[-4000:]
    assert same_weights(final_weights(tmp_path), uninterrupted)


# Before a release only (nox -s slow). CI makes the same preemption through test_cluster_slurm.py: its requeue
# test sends SIGTERM through `srun` to two `accel launch` of this job with PREEMPT_SAVE and checks the same
# things (status 143, one complete checkpoint and nothing partial, the resume at the step under way, the
# uninterrupted run's parameters), and its SIGUSR1 test sends the signal to one launcher of two processes, as
# here, which saves and exits 143 through the same handler.
@pytest.mark.release(
    covered_by="test_cluster_slurm.py::test_srun_accel_launch_two_nodes_requeues_after_the_preemption_save "
    "and test_cluster_slurm.py::test_sigusr1_to_the_launcher_stops_the_run_like_sigterm"
)
def test_sigterm_to_launcher_saves_exits_143_and_resumes_exactly(tmp_path: pathlib.Path, uninterrupted: list) -> None:
    steps = tmp_path / "steps.log"
    code, out = signal_after_steps(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", JOB, str(tmp_path)],
        steps,
        4,
        signal.SIGTERM,
        env={"PREEMPT_SAVE": "1", "SLOW_STEP": "0.3", "MARK_STEPS": "1"},
        timeout=LAUNCH_TIMEOUT,
        exit_timeout=120,
    )
    assert code == 143, out[-4000:]
    assert "preemption requested (SIGTERM)" in out, out[-4000:]
    stopped_at = int(steps.read_text().splitlines()[-1].split()[1])
    checkpoints = sorted(os.listdir(tmp_path / "checkpoints"), key=lambda n: int(n.split("_")[1]))
    latest = tmp_path / "checkpoints" / checkpoints[-1]
    assert (latest / "accel_checkpoint.json").is_file() and (latest / "model.safetensors").is_file()
    assert not any(name.startswith(".") for name in os.listdir(tmp_path / "checkpoints"))  # nothing partial

    resumed = _launch(["--num_processes", "2"], tmp_path)
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, text[-4000:]
    assert f"resumed at batch {stopped_at}," in text  # the step under way when SIGTERM came was kept
    assert same_weights(final_weights(tmp_path), uninterrupted)


HANG = textwrap.dedent(
    """
    import datetime, os, sys, time, torch
    from accel_state.hangs import CollectiveTimeoutError
    from accel_state.kwargs import InitProcessGroupKwargs
    from accel_train import Accelerator

    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=10))])
    rank = accelerator.process_index
    open(os.path.join(sys.argv[1], f"pid_{rank}"), "w").write(str(os.getpid()))
    accelerator.wait_for_everyone()
    started = time.monotonic()
    try:
        if rank == 0:
            accelerator.gather(torch.ones(2))  # rank 1 never calls this gather
        accelerator.wait_for_everyone()
    except CollectiveTimeoutError as error:
        print(f"RANK {rank} FAILED AFTER {time.monotonic() - started:.1f} s: {error}", flush=True)
        raise
    print(f"RANK {rank} NOT REACHED", flush=True)
    """
)


def test_missing_collective_ends_on_every_rank_with_the_named_error(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    done = run_command(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", str(script), str(tmp_path)], timeout=300
    )
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-4000:]
    assert "NOT REACHED" not in text
    lines = {
        rank: next((line for line in text.splitlines() if f"RANK {rank} FAILED AFTER" in line), "") for rank in (0, 1)
    }
    assert "collective `gather` (#2 on rank 0)" in lines[0] and "rank(s) 1 did not arrive" in lines[0], text[-4000:]
    assert "rank 1 waits in `wait_for_everyone` (its collective #2)" in lines[0]
    assert "collective `wait_for_everyone` (#2 on rank 1)" in lines[1] and "rank(s) 0 did not arrive" in lines[1]
    assert "rank 0 waits in `gather`" in lines[1]
    for rank in (0, 1):
        seconds = float(lines[rank].split("FAILED AFTER ")[1].split(" s:")[0])
        assert seconds < 60, lines[rank]
        pid = int((tmp_path / f"pid_{rank}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no worker is left behind


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="signals and accel launch multi-process need POSIX")

"""Restarts under ``accel launch --max_restarts`` with a manual resume: the script opts in to accel's
``replay_epoch_on_resume`` (not ``use_stateful_dataloader``), so after ``load_state`` the epoch replays
from its first batch in its saved order and the loop skips the batches it trained on with ``continue``
(``faults_job.py`` with ``RESUME_SKIP``).
Killed three times, it ends with the parameters of the uninterrupted run of the same script (the fault tests'
run, in conftest: ``RESUME_SKIP`` changes only what a resumed run does).

Runs before a release (``nox -s slow``): CI checks both of its parts on the same code paths.
``test_faults.py::test_killed_workers_restart_and_resume_exactly`` kills the same workers at the same batches
under the same ``accel launch --cpu --num_processes 2 --max_restarts 3`` and checks the same resumes; and
``test_resume_manual_skip.py``'s MULTI_CPU case loads the state in a fresh process with
``replay_epoch_on_resume=True`` and skips the seen batches of the second epoch with ``continue`` (a restarted
worker is such a fresh process). Each run here is four rounds of two workers, 66 s of CI13's two cores."""

from __future__ import annotations

import pathlib

import pytest
import torch
from conftest import ROOT, accel_command, run_command
from safetensors.torch import load_file

JOB = str(ROOT / "integration_tests" / "faults_job.py")


def _launch(args: list[str], project: pathlib.Path, env: dict[str, str]) -> str:
    project.mkdir(parents=True, exist_ok=True)
    done = run_command([*accel_command(), "launch", "--cpu", *args, JOB, str(project)], timeout=600, env=env)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    return text


def _final(project: pathlib.Path) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(project / f"final_{rank}.safetensors")) for rank in (0, 1)]


@pytest.mark.release(
    covered_by="test_faults.py::test_killed_workers_restart_and_resume_exactly and "
    "test_resume_manual_skip.py's MULTI_CPU case"
)
def test_restarts_with_a_continue_skip_resume_exactly(tmp_path: pathlib.Path, uninterrupted: list) -> None:
    manual = {"RESUME_SKIP": "continue"}
    faults = "0:1:5:kill,1:0:11:raise,2:1:13:exit"  # between accumulation steps; checkpoints every 3 batches
    text = _launch(
        ["--num_processes", "2", "--max_restarts", "3"], tmp_path / "restarted", {**manual, "FAULTS": faults}
    )
    for line in ("attempt 1: resumed at batch 3", "attempt 2: resumed at batch 9", "DONE attempt 3 batches 16"):
        assert line in text, text[-4000:]
    # RESUME_SKIP changes what a resumed run does only: uninterrupted, the job trains as the fault tests'
    # uninterrupted run (conftest), which is launched once for all of them
    for restarted, straight in zip(_final(tmp_path / "restarted"), uninterrupted):
        assert restarted.keys() == straight.keys()
        assert all(torch.equal(restarted[k], straight[k]) for k in straight)

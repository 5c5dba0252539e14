"""The example scripts a user starts from, run as a user runs them (``accel launch`` where it is about several processes)."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest
from conftest import ROOT, accel_command, run_command

EXAMPLES = ROOT / "examples"


def test_big_model_inference_with_disk_offload(tmp_path: pathlib.Path) -> None:
    result = run_command(
        [sys.executable, str(EXAMPLES / "big_model_inference.py"), "--output_dir", str(tmp_path), "--depth", "6"],
        timeout=300,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    plan = re.findall(r"^  (cpu|disk)\s+\| (.+)$", text, flags=re.M)
    assert [device for device, _ in plan] == ["cpu", "disk"], text
    on_disk = plan[1][1].split()
    assert "head" in on_disk and "embed" in plan[0][1].split()
    in_place = re.search(
        r"(\d+) modules on disk \((\d+) weights read in place from the safetensors shards, 0 copied", text
    )
    assert in_place and int(in_place.group(1)) == len(on_disk) and int(in_place.group(2)) >= 2 * len(on_disk), text
    assert "same tokens as the in-memory model" in text


def _launch(project: pathlib.Path, *extra: str):
    return run_command(
        [
            *accel_command(),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(EXAMPLES / "resumable_training.py"),
            "--project_dir",
            str(project),
            *extra,
        ],
        timeout=300,
    )


def _fingerprint(text: str) -> str:
    found = re.findall(r"weights fingerprint ([0-9a-f]{16})", text)
    assert len(found) == 1, text[-4000:]
    return found[0]


def _crash_and_resume(project: pathlib.Path) -> str:
    """Crash the example at step 31, check what it left, start it again; the resumed run's output."""
    crashed = _launch(project, "--crash_at_step", "31")
    assert crashed.returncode != 0 and "crashing at step 31" in crashed.stdout
    assert sorted(p.name for p in (project / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_3"]

    resumed = _launch(project)
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, text[-4000:]
    assert "resumed at step 28 (epoch 2)" in text
    return text


def test_resumable_training_crashes_and_resumes_where_it_stopped(tmp_path: pathlib.Path) -> None:
    """The example's crash and resume, in every CI run; that the resumed run ends bit for bit as an
    uninterrupted one is checked below before a release."""
    text = _crash_and_resume(tmp_path / "crashed")
    assert "finished at step 60;" in text
    _fingerprint(text)


# Before a release only (nox -s slow): its uninterrupted run is the one launch more that the comparison needs.
# In CI the test above makes the same crash and resume, and the ending equal to the uninterrupted run after a
# relaunch, on the same code path (load_state of the latest complete checkpoint with use_stateful_dataloader,
# automatic naming, continue_numbering_on_load), is test_cluster_slurm.py's requeue test.
@pytest.mark.release(
    covered_by="test_resumable_training_crashes_and_resumes_where_it_stopped and "
    "test_cluster_slurm.py::test_srun_accel_launch_two_nodes_requeues_after_the_preemption_save"
)
def test_resumable_training_resumes_exactly_after_a_crash(tmp_path: pathlib.Path) -> None:
    straight = _launch(tmp_path / "straight")
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-4000:]
    assert "starting from scratch" in straight.stdout

    text = _crash_and_resume(tmp_path / "crashed")
    assert _fingerprint(text) == _fingerprint(straight.stdout)


def _checksum(text: str) -> str:
    found = re.findall(r"done: \d+ steps, parameter checksum (-?[0-9.]+)", text)
    assert len(found) == 1, text[-4000:]
    return found[0]


PREEMPTIBLE = [
    *accel_command(),
    "launch",
    "--cpu",
    "--num_processes",
    "2",
    "--max_restarts",
    "3",
    str(EXAMPLES / "preemptible_training.py"),
]


def _killed_and_restarted(project: pathlib.Path) -> str:
    """Run the example with its last worker killed after step 25; the launch's output, once it ended well."""
    killed = run_command([*PREEMPTIBLE, "--project_dir", str(project), "--kill_at", "25"], timeout=300)
    text = killed.stdout + killed.stderr
    assert killed.returncode == 0, text[-4000:]
    assert "resumed at epoch 1, step 20" in text
    return text


def test_preemptible_training_restarts_after_a_killed_worker(tmp_path: pathlib.Path) -> None:
    """The example's killed worker and restart, in every CI run; that the run ends bit for bit as an
    uninterrupted one is checked below before a release."""
    text = _killed_and_restarted(tmp_path / "killed")
    assert "done: 48 steps," in text
    _checksum(text)


# Before a release only (nox -s slow): its uninterrupted run is the launch more that the comparison needs.
# In CI the test above makes the same kill and restart, and test_faults.py's killed-workers test checks
# the ending on the same code path: the last worker SIGKILLed under `accel launch --max_restarts 3`, the
# group restarted, load_state of the latest complete checkpoint with use_stateful_dataloader, accumulation
# 2, automatic naming, continue_numbering_on_load and a registered progress object, and the final
# parameters equal to an uninterrupted run's bit for bit.
@pytest.mark.release(
    covered_by="test_preemptible_training_restarts_after_a_killed_worker and "
    "test_faults.py::test_killed_workers_restart_and_resume_exactly"
)
def test_preemptible_training_survives_a_killed_worker(tmp_path: pathlib.Path) -> None:
    straight = run_command([*PREEMPTIBLE, "--project_dir", str(tmp_path / "straight")], timeout=300)
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-4000:]
    text = _killed_and_restarted(tmp_path / "killed")
    assert _checksum(text) == _checksum(straight.stdout + straight.stderr)


def test_ray_example_without_ray_says_what_it_did(tmp_path: pathlib.Path) -> None:
    """``--plain`` (the script under ``accel launch``, no Ray) trains and says so, once, from the main process."""
    launch = [*accel_command(), "launch", "--cpu", "--num_processes", "2"]
    out = tmp_path / "plain"
    result = run_command([*launch, str(EXAMPLES / "ray_train.py"), "--plain", "--out", str(out)], timeout=300)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    final = out / "final.safetensors"
    assert final.is_file()
    lines = re.findall(
        r"^trained epochs 1-4, last loss [0-9.]+ on 2 process\(es\); final weights in (.+)$", result.stdout, re.M
    )
    assert lines == [str(final)], result.stdout

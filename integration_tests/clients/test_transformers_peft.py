"""transformers' Trainer, from_pretrained(device_map=...) and peft on accel, through the opt-in
``accelerate`` alias (ACCEL_PROVIDE_ACCELERATE=1). Skipped unless transformers and peft are installed
and the real ``accelerate`` is not (``nox -s clients`` installs them, pinned)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("peft") is None,
    reason="needs transformers and peft (nox -s clients installs them)",
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "ACCEL_PROVIDE_ACCELERATE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }


def _run(args: list[str], cwd: pathlib.Path, processes: int) -> str:
    launcher = (
        [sys.executable]
        if processes == 1
        else [sys.executable, "-m", "accel_launch.cli", "launch", "--cpu", "--num_processes", str(processes)]
    )
    done = subprocess.run(
        [*launcher, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done.stdout


@pytest.mark.parametrize(
    "processes",
    # the one-process run repeats, without the sharded loader, what the two-process run checks
    [pytest.param(1, marks=pytest.mark.release(covered_by="the two-process run")), 2],
)
def test_trainer_resume_equals_uninterrupted_and_eval_loss_matches_hand(tmp_path, processes: int) -> None:
    script = str(HERE / "trainer_run.py")
    _run([script, "full", "full"], tmp_path, processes)
    # The uninterrupted run saved checkpoint-4 (save_steps=4) as a run stopped after step 4 would: the
    # checkpoint is written at the step, before anything after it runs. A fresh launch resumes from a copy
    # of it, where the uninterrupted run's later checkpoint-8 is not (one client launch fewer than
    # stopping a run of its own).
    assert (tmp_path / "full" / "checkpoint-8").is_dir()
    (tmp_path / "cut").mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-4", tmp_path / "cut" / "checkpoint-4")
    _run([script, "cut", "resume"], tmp_path, processes)
    full = torch.load(tmp_path / "full" / "final-full.pt")
    resumed = torch.load(tmp_path / "cut" / "final-resume.pt")
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name
    metrics = json.loads((tmp_path / "full" / "metrics-full.json").read_text())
    # the process that trained had accel for `accelerate` (trainer_run.accelerate_facts)
    assert metrics["accelerate_is_accel"] and "+accel." in metrics["accelerate_version"], metrics
    assert metrics["world"] == processes
    # the Trainer's eval loss equals the one computed by hand from the final weights (trainer_run.hand_eval_loss)
    assert metrics["eval_loss"] == pytest.approx(metrics["hand_eval_loss"], rel=1e-5)


@pytest.fixture(scope="session")
def offload_and_lora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """What ``offload_and_lora.py`` reports of its two parts, run in one process: each start of the client
    stack costs about 12 CPU-s, and neither part leaves anything the other reads (own folders, own models).

    Run once per test run by whichever pytest-xdist worker asks first (the other waits on a lock and reads
    the same results): xdist_group does not hold with this pytest (9.x names items by ``_id``, which the group
    suffix of pytest-xdist 3.8 does not change), so both tests may land on different workers."""
    base = tmp_path_factory.getbasetemp()
    workdir = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "offload_and_lora"
    with open(f"{workdir}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = workdir / "results.json"
        if not done.exists():
            workdir.mkdir(exist_ok=True)
            out = _run([str(HERE / "offload_and_lora.py"), str(workdir), "offload", "lora"], workdir, 1)
            results = {}
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    part, text = line.removeprefix("RESULT ").split(" ", 1)
                    results[part] = json.loads(text)
            assert results.keys() == {"offload", "lora"}, out[-4000:]
            done.write_text(json.dumps(results))
    return json.loads(done.read_text())


# one xdist worker would run both (nox -s clients: --dist loadgroup) where the group holds; the lock above
# makes the run once either way
@pytest.mark.xdist_group("offload_and_lora")
def test_from_pretrained_with_part_of_the_model_on_disk(offload_and_lora: dict[str, dict]) -> None:
    result = offload_and_lora["offload"]
    assert result["devices"] == ["cpu", "disk"]
    assert result["max_difference"] == 0.0


@pytest.mark.xdist_group("offload_and_lora")
def test_lora_adapter_trains_with_peft(offload_and_lora: dict[str, dict]) -> None:
    result = offload_and_lora["lora"]
    assert result["trainable_are_lora"] and result["base_unchanged"]
    assert result["loss_after"] < result["loss_before"]

"""``accel test``: the self-test through the real launcher, on one and on two CPU processes."""

from __future__ import annotations

import pathlib
import sys

import pytest
from conftest import run_command


def _config(tmp_path: pathlib.Path, processes: int) -> pathlib.Path:
    path = tmp_path / f"config_{processes}.yaml"
    distributed = "MULTI_CPU" if processes > 1 else "NO"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\n"
        f"distributed_type: {distributed}\n"
        "mixed_precision: bf16\n"
        f"num_processes: {processes}\n"
        "num_machines: 1\n"
        "machine_rank: 0\n"
        "use_cpu: true\n"
    )
    return path


def test_accel_test_two_processes(tmp_path: pathlib.Path) -> None:
    result = run_command(
        [sys.executable, "-m", "accel_train.commands.test", "--config_file", str(_config(tmp_path, 2))], timeout=600
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "7/7 checks passed on 2 process(es), MULTI_CPU, mixed precision bf16" in text
    assert "Test is a success!" in text


# Before a release only (nox -s slow): the two-process case runs the same command through a config file and
# `accel launch`, with the same seven checks under bf16; accel-train's own session runs those checks in one
# process (distributed type NO) in every CI run.
@pytest.mark.release(
    covered_by="test_accel_test_two_processes and "
    "packages/accel-train/tests/test_train_commands.py::test_self_test_passes_in_one_process"
)
def test_accel_test_single_process(tmp_path: pathlib.Path) -> None:
    result = run_command(
        [sys.executable, "-m", "accel_train.commands.test", "--config_file", str(_config(tmp_path, 1))], timeout=600
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "7/7 checks passed on 1 process(es)" in text

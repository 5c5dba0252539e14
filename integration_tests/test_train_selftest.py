"""``accel test``: the self-test through the real launcher, on one and on two CPU processes."""

from __future__ import annotations

import pathlib
import sys

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


def test_accel_test_single_process(tmp_path: pathlib.Path) -> None:
    result = run_command(
        [sys.executable, "-m", "accel_train.commands.test", "--config_file", str(_config(tmp_path, 1))], timeout=600
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "7/7 checks passed on 1 process(es)" in text

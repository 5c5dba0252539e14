"""End-to-end: `accel launch` starts real processes (CPU, gloo) that form one group.

One machine with two processes, and two `accel launch` invocations acting as two machines over
loopback (before a release; CI makes that launch in test_cluster_launcher.py). Each process checks its
rank, the world size and an all-reduce, and reports its pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import accel_command, run_command

from accel_state.testing import free_port

SCRIPT = """
import json, os, sys
import torch
from accel_state.operations import reduce
from accel_state.state import PartialState

state = PartialState()
total = reduce(torch.tensor([float(state.process_index + 1)]), reduction="sum").item()
assert state.num_processes == int(os.environ["WORLD_SIZE"]) == 2, state.num_processes
assert total == 3.0, total
out = sys.argv[1]
with open(os.path.join(out, f"rank{state.process_index}.json"), "w") as handle:
    json.dump({"rank": state.process_index, "world": state.num_processes, "total": total, "pid": os.getpid(),
               "local_rank": state.local_process_index, "backend": state.backend,
               "cpu": os.environ.get("ACCELERATE_USE_CPU"), "precision": os.environ.get("ACCELERATE_MIXED_PRECISION")}, handle)
print(f"rank {state.process_index} of {state.num_processes}: all-reduce {total}")
"""


def _records(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


def test_launch_cpu_two_processes(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    result = run_command(
        [
            *accel_command(),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--mixed_precision",
            "bf16",
            "--log_dir",
            str(logs),
            "--tee",
            "3",
            str(script),
            str(out),
        ],
        env={"HF_HOME": str(tmp_path / "home")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = _records(out)
    assert [r["rank"] for r in records] == [0, 1]
    assert [r["local_rank"] for r in records] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 3.0 and r["backend"] == "gloo" for r in records)
    assert all(r["cpu"] == "true" and r["precision"] == "bf16" for r in records)
    assert len({r["pid"] for r in records}) == 2  # two real processes, not one
    # --log_dir with --tee: each rank's output also lands in a log file
    logged = "".join(path.read_text() for path in logs.rglob("stdout.log"))
    assert "rank 0 of 2" in logged and "rank 1 of 2" in logged


# Before a release only (nox -s slow): test_cluster_launcher.py's PET test makes the same launch in CI (two
# `accel launch`, one process each, static rendezvous on 127.0.0.1, each rank checking world and all-reduce);
# its plan differs from this one only in where the settings come from (PET_* variables instead of these
# flags), and both readings are unit-tested in accel-launch (test_launch_plan, test_launch_topology_plan).
@pytest.mark.release(covered_by="test_cluster_launcher.py::test_two_launches_with_only_pet_variables_form_one_run")
def test_launch_two_machines_over_loopback(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    base = [
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
    ]
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HOME": str(tmp_path / "home")}
    machines = [
        subprocess.Popen(
            [*base, "--machine_rank", str(rank), str(script), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for machine in machines:
            outputs.append(machine.communicate(timeout=300)[0])
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    assert [m.returncode for m in machines] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    records = _records(out)
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 3.0 and r["local_rank"] == 0 for r in records)
    assert "rank 0 of 2" in outputs[0] and "rank 1 of 2" in outputs[1]


def test_launch_as_python_module(tmp_path: Path) -> None:
    """`python -m accel_launch.commands.launch` works like `accel launch` (one process, -m module)."""
    package = tmp_path / "pkgdir"
    package.mkdir()
    (package / "hello_mod.py").write_text(
        "import os, sys\nprint('module ran', os.environ['ACCELERATE_USE_CPU'], sys.argv[1:])\n"
    )
    result = run_command(
        [sys.executable, "-m", "accel_launch.commands.launch", "--cpu", "-m", "hello_mod", "--flag"],
        env={"HF_HOME": str(tmp_path / "home"), "PYTHONPATH": str(package)},
        cwd=str(package),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module ran true ['--flag']"

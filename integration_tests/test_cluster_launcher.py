"""End-to-end: launcher hygiene and the schedulers' variables, with real processes (CPU, gloo).

- SIGKILL of the launcher: no worker is left after 5 s (parent-death signal).
- A one-machine run: the launcher's store listens on 127.0.0.1 only.
- A failing worker: the launcher names the rank that failed first.
- Kubernetes: two ``accel launch`` invocations with only ``PET_*`` variables form one 2-machine run.
- ``--dry_run --json``: the plan matches what the processes of a real launch then report.
- ``--multi_gpu`` without a GPU: each process runs on its own, as in the documented system.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import accel_command, run_command

from accel_state.testing import free_port

REPORT = """
import json, os, sys, time
import torch
from accel_state.operations import reduce
from accel_state.state import PartialState

state = PartialState()
total = reduce(torch.tensor([float(state.process_index + 1)]), reduction="sum").item()
out = sys.argv[1]
with open(os.path.join(out, f"rank{state.process_index}.json"), "w") as handle:
    json.dump({"rank": state.process_index, "world": state.num_processes, "total": total,
               "local_rank": state.local_process_index, "local_world": state.local_num_processes,
               "backend": state.backend, "precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
               "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
               "fsdp": os.environ.get("ACCELERATE_USE_FSDP"), "fsdp_version": os.environ.get("FSDP_VERSION")}, handle)
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
"""


def _records(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on (IPv4 and IPv6), read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != "0A" or parts[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = parts[1].split(":")
            if width == 8:
                text = socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1])
            else:
                raw = bytes.fromhex(address)
                text = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
            out.append((text, int(port, 16)))
    return out


def _start(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_workers_die_with_a_sigkilled_launcher_and_the_store_is_on_loopback(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    out = tmp_path / "out"
    out.mkdir()
    launcher = _start([*accel_command(), "launch", "--cpu", "--num_processes", "2", str(script), str(out), "120"])
    try:
        assert _wait_for(lambda: len(_records(out)) == 2, 120), launcher.stderr.read() if launcher.poll() else ""
        workers = _children(launcher.pid)
        assert len(workers) == 2, workers
        listening = _listening(launcher.pid)
        assert listening, "the launcher's store should listen"
        assert all(address == "127.0.0.1" for address, _ in listening), listening
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        assert _wait_for(lambda: not any(_alive(pid) for pid in workers), 5.0), [p for p in workers if _alive(p)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _children(launcher.pid):
            os.kill(pid, signal.SIGKILL)


RESTARTED = (
    """
import os
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    raise SystemExit(3)  # the first round fails: the group is restarted in a new rendezvous round
"""
    + REPORT
)


def test_with_restarts_the_store_of_each_round_is_the_launchers_on_loopback(tmp_path: Path) -> None:
    script = tmp_path / "restarted.py"
    script.write_text(RESTARTED)
    out = tmp_path / "out"
    out.mkdir()
    command = [*accel_command(), "launch", "--cpu", "--num_processes", "2", "--max_restarts", "1"]
    launcher = _start([*command, str(script), str(out), "120"])
    try:
        assert _wait_for(lambda: len(_records(out)) == 2, 240), launcher.stderr.read() if launcher.poll() else ""
        (address, port), second = (record["master"] for record in _records(out))
        assert second == [address, port] and address == "127.0.0.1", second  # the workers' store of round 2
        listening = _listening(launcher.pid)
        assert ("127.0.0.1", int(port)) in listening, listening  # hosted by the launcher ...
        assert all(host == "127.0.0.1" for host, _ in listening), listening  # ... on loopback, as its other store
        for worker in _children(launcher.pid):
            assert int(port) not in {p for _, p in _listening(worker)}  # not by worker rank 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _children(launcher.pid):
            os.kill(pid, signal.SIGKILL)


FAILS = """
import sys, time
from accel_state.state import PartialState
state = PartialState()
state.wait_for_everyone()
if state.process_index == 1:
    raise SystemExit(7)
time.sleep(60)
"""


def test_the_exit_message_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(FAILS)
    result = run_command([*accel_command(), "launch", "--cpu", "--num_processes", "2", str(script)], timeout=180)
    assert result.returncode == 1
    line = [text for text in result.stderr.splitlines() if text.startswith("accel launch:")][-1]
    assert "rank 1 failed first (exit code 7)" in line and "rank 0 was stopped by the launcher" in line, line


def test_two_launches_with_only_pet_variables_form_one_run(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    common = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }
    runs = [
        _start([*accel_command(), "launch", str(script), str(out)], env={**common, "PET_NODE_RANK": str(rank)})
        for rank in (0, 1)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=240)
        assert run.returncode == 0, stderr[-3000:]
    records = _records(out)
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 3.0 and r["local_world"] == 1 for r in records)
    assert all(r["master"] == ["127.0.0.1", str(port)] for r in records)


def test_the_plain_master_addr_fills_a_several_machine_run(tmp_path: Path) -> None:
    shown = run_command(
        [
            *accel_command(),
            "launch",
            "--cpu",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--dry_run",
            "--json",
            "t.py",
        ],
        env={"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456"},
    )
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)
    assert plan["rendezvous"]["address"] == {"value": "10.1.2.3", "source": "environment MASTER_ADDR"}
    assert plan["rendezvous"]["port"] == {"value": 23456, "source": "environment MASTER_PORT"}


def test_the_dry_run_plan_is_what_the_launch_does(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text("mixed_precision: bf16\nuse_cpu: true\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n")
    port = free_port()
    args = ["launch", "--config_file", str(config), "--num_processes", "2", "--main_process_port", str(port)]
    env = {"HF_HOME": str(tmp_path / "home")}
    dry = run_command([*accel_command(), *args, "--dry_run", "--json", str(script), str(out)], env=env)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert not list(out.iterdir())  # nothing was started
    assert plan["num_processes"] == {"value": 2, "source": "flag --num_processes"}
    assert plan["mixed_precision"] == {"value": "bf16", "source": f"config file {config}"}
    assert plan["strategy"]["value"] == "FSDP" and plan["strategy"]["source"] == f"config file {config}"
    assert plan["strategy"]["settings"]["fsdp_version"] == {"value": 2, "source": f"config file {config}"}
    assert plan["machines"]["value"] == 1 and plan["scheduler"] is None
    real = run_command([*accel_command(), *args, str(script), str(out)], env=env, timeout=240)
    assert real.returncode == 0, real.stderr[-3000:]
    records = _records(out)
    assert [r["rank"] for r in records] == plan["ranks_on_this_machine"]
    assert all(r["world"] == plan["num_processes"]["value"] for r in records)
    assert all(r["backend"] == plan["backend"]["value"] for r in records)
    assert all(r["precision"] == plan["mixed_precision"]["value"] for r in records)
    assert all(
        r["master"] == [plan["rendezvous"]["address"]["value"], str(plan["rendezvous"]["port"]["value"])]
        for r in records
    )
    assert all(r["fsdp"] == plan["environment"]["ACCELERATE_USE_FSDP"] == "true" for r in records)
    assert all(r["fsdp_version"] == plan["environment"]["FSDP_VERSION"] == "2" for r in records)


#: Each independent copy writes its own record (all of them are process 0, so rank-named files collide).
COPY_REPORT = """
import json, os, sys
import torch.distributed as dist
from accel_state.state import PartialState

state = PartialState()
with open(os.path.join(sys.argv[1], f"copy{os.getpid()}.json"), "w") as handle:
    json.dump({"type": str(state.distributed_type), "world": state.num_processes, "rank": state.process_index,
               "group": dist.is_initialized(), "device": str(state.device)}, handle)
"""


def test_multi_gpu_without_gpu_runs_each_process_on_its_own_as_documented(tmp_path: Path) -> None:
    # As Hugging Face Accelerate 1.15 on a machine without GPU: two processes, neither in a process group.
    # (--cpu_fallback, the opt-in to one gloo group, is the torchrun path the other tests here launch.)
    script = tmp_path / "report.py"
    script.write_text(COPY_REPORT)
    out = tmp_path / "out"
    out.mkdir()
    done = run_command(
        [*accel_command(), "launch", "--multi_gpu", "--num_processes", "2", str(script), str(out)], timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each process runs on the CPU on its own" in done.stderr and "--cpu_fallback" in done.stderr
    records = [json.loads(path.read_text()) for path in sorted(out.glob("copy*.json"))]
    expected = {"type": "DistributedType.NO", "world": 1, "rank": 0, "group": False, "device": "cpu"}
    assert records == [expected, expected]

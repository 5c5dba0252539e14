"""Restarts and preemption at the launcher: the rendezvous a restartable run uses, and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_launch_plan import plan_of

from accel_launch.commands_build import rendezvous_backend, restart_environment, torchrun_args
from accel_launch.runner import TERMINATED_EXIT_CODE


def test_restarts_use_c10d_rendezvous_on_the_same_address() -> None:
    plan = plan_of(["--cpu", "--num_processes", "2", "--max_restarts", "1"])
    assert rendezvous_backend(plan) == "c10d"
    args = torchrun_args(plan, 4321)
    assert args[args.index("--rdzv_backend") + 1] == "c10d"
    assert args[args.index("--rdzv_endpoint") + 1] == "127.0.0.1:4321"
    assert "--master_port" not in args and "--node_rank" not in args
    assert restart_environment(plan) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def test_no_restarts_keep_static_rendezvous() -> None:
    plan = plan_of(["--cpu", "--num_processes", "2"])
    assert rendezvous_backend(plan) == "static"
    args = torchrun_args(plan, 4321)
    assert args[args.index("--master_port") + 1] == "4321" and "--rdzv_backend" not in args
    assert restart_environment(plan) == {}


def test_chosen_c10d_with_restarts_gets_a_fresh_worker_store_per_round() -> None:
    plan = plan_of(
        ["--cpu", "--num_processes", "2", "--rdzv_backend", "c10d", "--max_restarts", "3", "--main_process_ip", "h0"]
    )
    assert torchrun_args(plan, 29400)[torchrun_args(plan, 29400).index("--rdzv_endpoint") + 1] == "h0:29400"
    assert restart_environment(plan) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert restart_environment(plan_of(["--cpu", "--num_processes", "2", "--rdzv_backend", "c10d"])) == {}


CHILD = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


def test_sigterm_to_a_single_process_launch_reaches_the_child(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    pid_file = tmp_path / "pid"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "accel_launch.cli", "launch", "--cpu", str(script), str(pid_file)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert code == TERMINATED_EXIT_CODE == 143
    try:
        os.kill(child, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the child outlived the launcher"


def rank_dies_once(out_dir: str) -> None:
    """Rank 1 kills itself in the first attempt; the restarted group all-reduces and reports."""
    import torch

    from accel_state.operations import reduce
    from accel_state.state import PartialState

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    state = PartialState()
    if attempt == 0 and state.process_index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    total = reduce(torch.tensor([float(state.process_index + 1)]), reduction="sum")
    Path(out_dir, f"rank{state.process_index}").write_text(f"{attempt} {total.item()}")


def test_notebook_launcher_restarts_a_killed_group(tmp_path: Path) -> None:
    from accel_launch.launchers import notebook_launcher
    from accel_state.testing import free_port

    port = free_port()
    notebook_launcher(rank_dies_once, (str(tmp_path),), num_processes=2, use_port=str(port), max_restarts=1)
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["1 3.0", "1 3.0"]

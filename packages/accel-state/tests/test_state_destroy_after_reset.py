"""``destroy_process_group()`` after ``_reset_state()`` still tears down the group accel started,
and never one it adopted (started by the user or by another library such as Ray Train)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, socket, sys
    import torch.distributed as dist
    from accel_state.state import AcceleratorState, PartialState

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mode = sys.argv[1]
    if mode == "adopted":
        dist.init_process_group("gloo")
    PartialState(cpu=True)
    AcceleratorState._reset_state()
    AcceleratorState().destroy_process_group() if mode == "started" else PartialState().destroy_process_group()
    print("initialized after destroy:", dist.is_initialized())
    """
)


def _run(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_destroy_after_reset_tears_down_the_group_accel_started() -> None:
    assert "initialized after destroy: False" in _run("started")


def test_destroy_after_reset_keeps_a_group_accel_adopted() -> None:
    assert "initialized after destroy: True" in _run("adopted")

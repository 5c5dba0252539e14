"""``destroy_process_group()`` after ``_reset_state()`` still tears down the group accel started,
and never one it adopted (started by the user or by another library such as Ray Train). It is
callable on the class too, and does nothing when there is no process group (issue 37)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from accel_state.state import AcceleratorState, PartialState

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from accel_state.ports import free_port
    from accel_state.state import AcceleratorState, PartialState

    port = free_port()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mode = sys.argv[1]
    if mode == "adopted":
        dist.init_process_group("gloo")
    PartialState(cpu=True)
    AcceleratorState._reset_state()
    if mode == "started":
        AcceleratorState().destroy_process_group()
    elif mode == "adopted":
        PartialState().destroy_process_group()
    elif mode == "class":
        AcceleratorState._reset_state(True)
        AcceleratorState.destroy_process_group()
    elif mode == "stale-instance":
        state = AcceleratorState()
        AcceleratorState._reset_state(True)
        state.destroy_process_group()
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


@pytest.mark.parametrize("mode", ["class", "stale-instance"])
def test_destroy_on_the_class_or_a_reset_instance_tears_down_the_group_accel_started(mode: str) -> None:
    assert "initialized after destroy: False" in _run(mode)


@pytest.mark.parametrize("owner", [AcceleratorState, PartialState])
def test_destroy_without_a_process_group_is_a_no_op_on_the_class(owner: type) -> None:
    assert not dist.is_initialized()
    owner.destroy_process_group()
    owner.destroy_process_group(group=None)
    assert not dist.is_initialized()


def test_destroy_on_an_instance_kept_across_a_reset_is_a_no_op_without_a_group() -> None:
    state = AcceleratorState(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    state.destroy_process_group()  # raised AttributeError: the reset state had forgotten the method
    PartialState._reset_state()
    assert not dist.is_initialized()

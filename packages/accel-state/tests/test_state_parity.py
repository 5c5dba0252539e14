"""Behaviours scripts written for the documented system (release 1.15) rely on (issue 17)."""

from __future__ import annotations

from typing import Any

import pytest

from accel_state import devices
from accel_state.environment import patch_environment
from accel_state.state import AcceleratorState, PartialState
from accel_state.testing import run_distributed

# -- ACCELERATE_TORCH_DEVICE with an index pins the device ------------------------------------------


def test_device_string_splits_into_type_and_index() -> None:
    assert devices.parse_device("cuda:1") == ("cuda", 1)
    assert devices.parse_device("xpu") == ("xpu", None)
    for bad in ("cuda:x", ":1", "cuda:"):
        with pytest.raises(ValueError, match="ACCELERATE_TORCH_DEVICE"):
            devices.parse_device(bad)


def test_pinned_index_wins_over_the_local_rank() -> None:
    assert devices.pick_device_index("cuda", local_rank=1, count=4) == 1
    assert devices.pick_device_index("cuda", local_rank=5, count=4) == 1
    assert devices.pick_device_index("cuda", local_rank=1, count=4, forced_index=3) == 3
    assert devices.pick_device_index("cpu", local_rank=1, count=1) is None


def test_state_device_keeps_the_pinned_index() -> None:
    with patch_environment(ACCELERATE_TORCH_DEVICE="cpu:1", ACCELERATE_USE_CPU="false"):
        state = PartialState()
        assert (state.device.type, state.device.index) == ("cpu", 1)
    PartialState._reset_state()
    with patch_environment(ACCELERATE_TORCH_DEVICE="cpu", ACCELERATE_USE_CPU="false"):
        assert PartialState().device.index is None


def _device_of_this_rank() -> tuple[int, str]:
    state = PartialState()
    return state.local_process_index, str(state.device)


def test_every_rank_uses_the_pinned_index_not_its_local_rank() -> None:
    results = run_distributed(
        _device_of_this_rank, env={"ACCELERATE_TORCH_DEVICE": "cpu:0", "ACCELERATE_USE_CPU": "false"}, timeout=60
    )
    assert results == [(0, "cpu:0"), (1, "cpu:0")]


# -- a reset PartialState does not leave a stale AcceleratorState behind ----------------------------


def test_accelerator_state_recovers_after_partial_state_reset() -> None:
    state = AcceleratorState(mixed_precision="no", cpu=True, fsdp_plugin=object())
    PartialState._reset_state()
    again = AcceleratorState()
    # The process-level half is set up again; what AcceleratorState itself holds is kept.
    assert again.device.type == "cpu"
    assert PartialState().initialized
    assert again.fsdp_plugin is state.fsdp_plugin
    assert again.distributed_type == "FSDP"


def test_a_new_accelerator_rebuilds_a_stale_state_from_its_arguments() -> None:
    AcceleratorState(mixed_precision="no", cpu=True)
    PartialState._reset_state()
    rebuilt = AcceleratorState(mixed_precision="bf16", cpu=True, _from_accelerator=True)
    assert rebuilt.mixed_precision == "bf16"
    assert rebuilt.num_processes == 1


def test_unknown_attribute_names_accelerator_state() -> None:
    state = AcceleratorState(cpu=True)
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'no_such_thing'"):
        _ = state.no_such_thing
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute `device`"):
        _ = AcceleratorState.__new__(AcceleratorState).device


def test_reading_an_attribute_of_a_reset_state_says_what_to_do() -> None:
    state: Any = AcceleratorState(cpu=True)
    PartialState._reset_state()
    with pytest.raises(AttributeError, match="_reset_state"):
        _ = state.num_processes

"""Behaviours scripts written for the documented system (release 1.15) rely on (issue 17)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

from accel_state import devices, operations
from accel_state.environment import patch_environment
from accel_state.state import AcceleratorState, PartialState
from accel_state.testing import DistributedPool, run_distributed

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
    # The process-level half is set up again (without cpu=True this time, so on the GPU if there is
    # one, as the documented system does); what AcceleratorState itself holds is kept.
    assert again.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
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


# -- collectives ------------------------------------------------------------------------------------


def _collectives_of_release_1_15() -> dict[str, Any]:
    from accel_state.nested import DistributedOperationException

    state = PartialState()
    rank = state.process_index
    values = torch.tensor([float(rank), 5.0 - rank, 3.0])  # rank 0: [0, 5, 3]; rank 1: [1, 4, 3]
    result: dict[str, Any] = {
        "max": operations.reduce(values, "max").tolist(),
        "min": operations.reduce(values, "min").tolist(),
        "sum": operations.reduce(values, "sum").tolist(),
    }
    ranked = torch.ones(*([2] * (rank + 1)))  # a 1-d tensor on rank 0, a 2-d one on rank 1
    assert not state.debug
    state.debug = True  # turned on at run time, not through the environment
    try:
        operations.pad_across_processes(ranked)
    except DistributedOperationException as error:
        result["pad_error"] = f"{error} / {error.__cause__}"
    finally:
        state.debug = False
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result["nested_same"] = operations.pad_across_processes(nested) is nested
    result["nested_warnings"] = [type(w.message).__name__ for w in caught]
    return result


def test_collectives_match_release_1_15(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(_collectives_of_release_1_15)
    for result in results:
        assert result["max"] == [1.0, 5.0, 3.0]
        assert result["min"] == [0.0, 4.0, 3.0]
        assert result["sum"] == [1.0, 9.0, 6.0]
        # Every rank raises (none aborts), and the error names the shapes each rank sent.
        assert "pad_across_processes" in result["pad_error"]
        assert "Process 0: [1, 1]" in result["pad_error"] and "Process 1: [1, 2]" in result["pad_error"]
        assert result["nested_same"] is True
        assert result["nested_warnings"] == ["CannotPadNestedTensorWarning"]


def test_reduce_max_and_min_in_one_process_return_the_values() -> None:
    values = torch.tensor([1.0, -2.0])
    assert operations.reduce(values, "max").tolist() == [1.0, -2.0]
    assert operations.reduce(values, "min").tolist() == [1.0, -2.0]
    with pytest.raises(ValueError, match="'max', 'min'"):
        operations.reduce(values, "median")


def test_debug_flag_set_on_the_state_at_run_time_is_what_counts() -> None:
    with patch_environment(ACCELERATE_DEBUG_MODE="1"):
        state = PartialState(cpu=True)
        assert operations._debug_mode()
        state.debug = False
        assert not operations._debug_mode()
    PartialState._reset_state()
    with patch_environment(ACCELERATE_DEBUG_MODE="1"):
        assert operations._debug_mode()  # no state yet: the variable decides


def test_concatenate_of_one_non_tensor_returns_it() -> None:
    marker = {"not", "a", "tensor"}
    assert operations.concatenate([marker]) is marker
    assert operations.concatenate([[1, "x"]]) == [1, "x"]
    with pytest.raises(TypeError, match="can only concatenate tensors"):
        operations.concatenate(["a", "b"])
    assert operations.concatenate([torch.ones(1), torch.zeros(1)]).tolist() == [1.0, 0.0]


# -- kwargs handlers: defaults are those of a clean environment -----------------------------------


def test_kwargs_handler_counts_values_read_from_the_environment_as_changes() -> None:
    import dataclasses

    from accel_state.kwargs import KwargsHandler

    @dataclasses.dataclass
    class FromEnvironment(KwargsHandler):
        level: str | None = None
        other: int = 1

        def __post_init__(self) -> None:
            if self.level is None:
                self.level = os.environ.get("ACCELERATE_TEST_LEVEL", "low")

    assert FromEnvironment().to_kwargs() == {}
    with patch_environment(ACCELERATE_TEST_LEVEL="high", UNRELATED_VARIABLE="kept"):
        assert FromEnvironment().to_kwargs() == {"level": "high"}
        assert FromEnvironment(other=2).to_kwargs() == {"level": "high", "other": 2}
        assert os.environ["ACCELERATE_TEST_LEVEL"] == "high"


# -- check_os_kernel ---------------------------------------------------------------------------------


def test_check_os_kernel_warns_below_5_5_0(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from accel_state.environment import check_os_kernel

    with caplog.at_level(logging.WARNING, logger="accel_state.environment"):
        with pytest.warns(UserWarning, match=r"kernel 5\.4\.0 is older than 5\.5\.0"):
            assert check_os_kernel("5.4.0-150-generic", "Linux") is True
    assert "5.4.0" in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_os_kernel("5.5.0", "Linux") is False
        assert check_os_kernel("6.8.0-1015-gcp", "Linux") is False
        assert check_os_kernel("4.19.0", "Darwin") is False  # not Linux: nothing to say
        assert check_os_kernel("unknown", "Linux") is False


def test_enums_have_the_documented_members() -> None:
    from accel_state.enums import DistributedType, DynamoBackend, RNGType

    assert DistributedType("MULTI_NEURON") is DistributedType.MULTI_NEURON
    assert DistributedType.parse("multi_neuron") is DistributedType.MULTI_NEURON
    assert RNGType("neuron") is RNGType.NEURON
    assert DynamoBackend.parse("neuron") is DynamoBackend.NEURON


def test_upcasting_layers_constant_is_lazy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accel_state.constants as c; assert 'torch' not in sys.modules; "
        "layers = c.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING; import torch; assert torch.nn.Linear in layers"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0

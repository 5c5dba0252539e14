"""Documented constants exist with their documented values, and state errors carry the documented phrases."""

from __future__ import annotations

import operator

import pytest
from packaging import version

from accel_state import constants
from accel_state.state import AcceleratorState, PartialState
from accel_state.testing import reset_shared_state


def test_version_constants_of_the_documented_module() -> None:
    assert constants.BETA_TP_AVAILABLE_PYTORCH_VERSION == "2.3.0"
    assert constants.BETA_TP_AVAILABLE_TRANSFORMERS_VERSION == "4.52.0"
    assert constants.BETA_CP_AVAILABLE_PYTORCH_VERSION == "2.6.0"
    assert constants.MITA_PROFILING_AVAILABLE_PYTORCH_VERSION == "2.1.0"
    assert constants.FSDP2_STATE_DICT_TYPE == ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]


def test_operation_table_maps_to_comparison_functions() -> None:
    table = constants.STR_OPERATION_TO_FUNC
    assert table[">="] is operator.ge and table["!="] is operator.ne
    assert table[">="](version.parse("2.13.0"), version.parse(constants.BETA_CP_AVAILABLE_PYTORCH_VERSION))
    assert not table["<"](version.parse("2.13.0"), version.parse("2.3.0"))


def test_distributed_type_lists_name_real_distributed_types() -> None:
    from accel_state.enums import DistributedType

    assert "MULTI_GPU" in constants.CUDA_DISTRIBUTED_TYPES
    assert set(constants.CUDA_DISTRIBUTED_TYPES) <= set(constants.TORCH_DISTRIBUTED_OPERATION_TYPES)
    assert {"MULTI_CPU", "MULTI_XPU"} <= set(constants.TORCH_DISTRIBUTED_OPERATION_TYPES)
    known = {member.name for member in DistributedType}
    assert set(constants.TORCH_DISTRIBUTED_OPERATION_TYPES) - {"TP"} <= known  # TP: listed, as documented


def test_reset_state_errors_say_what_happened() -> None:
    reset_shared_state()
    try:
        with pytest.raises(AttributeError, match=r"This happens if `PartialState._reset_state\(\)` was called"):
            _ = PartialState.__new__(PartialState).num_processes
        state = AcceleratorState.__new__(AcceleratorState)
        state.__dict__ = AcceleratorState._shared_state
        with pytest.raises(AttributeError, match=r"This happens if `AcceleratorState._reset_state\(\)` was called"):
            _ = state.num_processes
    finally:
        reset_shared_state()

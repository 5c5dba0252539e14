"""Names of the documented system (release 1.15) reachable through the meta-package (issue 17)."""

from __future__ import annotations

import importlib

import pytest

NAMES = [
    ("accel.accelerator", "DataLoaderConfiguration"),
    ("accel.utils.constants", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING"),
    ("accel.big_modeling", "attach_layerwise_casting_hooks"),
    ("accel.hooks", "LayerwiseCastingHook"),
    ("accel.commands.estimate", "gather_data"),
    ("accel.commands.estimate", "verify_on_hub"),
    ("accel.commands.test", "test_command_parser"),
    ("accel.commands.test", "test_command"),
    ("accel.commands.to_fsdp2", "load_config"),
    ("accel.utils.launch", "which"),
    ("accel.utils.launch", "subprocess"),
    ("accel.utils", "check_os_kernel"),
    ("accel.utils", "save"),
    ("accel.utils", "load"),
    ("accel.utils", "CannotPadNestedTensorWarning"),
    ("accel.utils", "DistributedType"),
]


@pytest.mark.parametrize(("module", "name"), NAMES)
def test_documented_name_is_reachable(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


def test_distributed_type_has_every_documented_member() -> None:
    from accel.utils import DistributedType

    documented = {
        "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
        "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON",
    }  # fmt: skip
    assert documented <= {member.name for member in DistributedType}


def test_patching_which_in_accel_utils_launch_reaches_the_launcher() -> None:
    from unittest import mock

    import accel.utils.launch as launch

    with mock.patch("accel.utils.launch.which", return_value=None):
        with pytest.raises(OSError, match="mpirun nor mpiexec"):
            launch.mpirun_spelling()

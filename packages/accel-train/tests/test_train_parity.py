"""Behaviours scripts written for the documented system (release 1.15) rely on (issue 17)."""

from __future__ import annotations

import os

import pytest

from accel_state.environment import patch_environment
from accel_train.plugins import TorchDynamoPlugin


def test_dynamo_plugin_reports_what_came_from_the_environment() -> None:
    assert TorchDynamoPlugin().to_kwargs() == {}
    with patch_environment(
        ACCELERATE_DYNAMO_BACKEND="INDUCTOR",
        ACCELERATE_DYNAMO_MODE="max-autotune",
        ACCELERATE_DYNAMO_USE_FULLGRAPH="true",
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="true",
    ):
        plugin = TorchDynamoPlugin()
        assert plugin.use_regional_compilation is True
        assert plugin.to_kwargs() == {"backend": "inductor", "mode": "max-autotune", "fullgraph": True}
        assert os.environ["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"  # the variables are back afterwards
    assert TorchDynamoPlugin(backend="eager", use_regional_compilation=True).to_kwargs() == {"backend": "eager"}
    assert TorchDynamoPlugin(backend="INDUCTOR").to_dict()["backend"] == "inductor"


def test_test_command_has_the_documented_names(tmp_path: object) -> None:
    import argparse

    from accel_train.commands import test as command

    parser = command.test_command_parser()
    assert parser.parse_args([]).config_file is None
    assert parser.parse_args(["--config_file", "c.yaml"]).config_file == "c.yaml"
    sub = argparse.ArgumentParser().add_subparsers()
    assert command.test_command_parser(sub).parse_args([]).func is command.run
    # a missing config file is refused before anything runs
    assert command.test_command(argparse.Namespace(config_file="/no/such/config.yaml")) == 2


def test_a_new_accelerator_after_partial_state_reset_rebuilds_the_state() -> None:
    from accel_state.state import AcceleratorState, PartialState
    from accel_train.accelerator import Accelerator

    first = Accelerator(cpu=True)
    assert first.state.mixed_precision == "no"
    PartialState._reset_state()  # what test suites and notebooks call
    second = Accelerator(cpu=True, mixed_precision="bf16")
    assert second.state.mixed_precision == "bf16"
    assert second.device.type == "cpu" and PartialState().initialized
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'nothing_here'"):
        _ = AcceleratorState().nothing_here

"""The meta-package: lazy names, and documented module paths that are the real modules."""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

import pytest

import accel
from accel import _exports


def test_import_accel_imports_no_torch_and_no_subpackage() -> None:
    code = (
        "import sys, json, time; t = time.perf_counter(); import accel; dt = time.perf_counter() - t;"
        " print(json.dumps({'dt': dt, 'loaded': sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('torch', 'accel_state', 'accel_data', 'accel_bigmodel', 'accel_quant', 'accel_tracking', 'accel_train', 'accel_launch'))}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []


def test_module_aliases_are_the_real_module_objects() -> None:
    import accel.state
    import accel.utils.operations
    import accel_state.operations
    import accel_state.state

    assert accel.state is accel_state.state
    assert accel.utils.operations is accel_state.operations
    assert sys.modules["accel.utils.operations"] is sys.modules["accel_state.operations"]


def test_patching_through_the_alias_reaches_the_running_code() -> None:
    import torch

    import accel_state.operations

    with mock.patch("accel.utils.operations.world_size", return_value=1) as patched:
        accel_state.operations.reduce(torch.ones(1))
    assert patched.called


def test_top_level_and_utils_names_resolve_lazily_to_the_owners_objects() -> None:
    import accel.utils
    import accel_state.operations
    import accel_state.state

    assert accel.PartialState is accel_state.state.PartialState
    assert accel.utils.gather is accel_state.operations.gather
    with pytest.raises(AttributeError, match="module 'accel' has no attribute 'NoSuchThing'"):
        _ = accel.NoSuchThing


@pytest.mark.parametrize("alias", sorted(_exports.MODULES))
def test_every_declared_module_alias_imports(alias: str) -> None:
    import importlib
    import importlib.util

    if alias == "accel.utils.rich" and importlib.util.find_spec("rich") is None:
        with pytest.raises(ModuleNotFoundError, match=r"accel-launch\[rich\]"):
            importlib.import_module(alias)
        return
    module = importlib.import_module(alias)
    assert module is sys.modules[_exports.MODULES[alias]]


@pytest.mark.parametrize("name", sorted(_exports.UTILS))
def test_every_declared_utility_resolves(name: str) -> None:
    import accel.utils

    assert getattr(accel.utils, name) is not None


@pytest.mark.parametrize("name", sorted(_exports.TOP_LEVEL))
def test_every_declared_top_level_name_resolves(name: str) -> None:
    assert getattr(accel, name) is not None


def test_declared_names_point_into_the_owning_packages() -> None:
    owners = (
        "accel_state",
        "accel_data",
        "accel_bigmodel",
        "accel_quant",
        "accel_tracking",
        "accel_train",
        "accel_launch",
    )
    for table in (_exports.TOP_LEVEL, _exports.UTILS, _exports.MODULES):
        for target in table.values():
            assert target.split(".")[0] in owners, target


def test_utils_dataclasses_gathers_names_from_their_owners() -> None:
    import accel_state.enums
    from accel.utils import dataclasses as dc

    assert dc.DistributedType is accel_state.enums.DistributedType
    assert len(dc.__all__) >= 10
    for name in dc.__all__:
        assert getattr(dc, name).__name__ == name


def test_the_sequence_parallel_config_is_where_the_documented_system_has_it() -> None:
    import accel.parallelism_config
    import accel.utils
    import accel.utils.dataclasses
    from accel_train.strategies.deepspeed.sequence_parallel import DeepSpeedSequenceParallelConfig

    for place in (accel.utils, accel.utils.dataclasses, accel.parallelism_config):
        assert place.DeepSpeedSequenceParallelConfig is DeepSpeedSequenceParallelConfig, place


def test_the_pipeline_config_is_exported_with_the_other_parallel_configs() -> None:
    import accel.utils
    import accel_train
    from accel import _exports
    from accel_train import parallel_plugins
    from accel_train.strategies.pipeline import PipelineParallelConfig

    assert accel.utils.PipelineParallelConfig is PipelineParallelConfig
    assert accel_train.PipelineParallelConfig is PipelineParallelConfig
    assert parallel_plugins.PipelineParallelConfig is PipelineParallelConfig
    # where the API reference takes its entries from, beside TorchTensorParallelConfig
    assert _exports.UTILS["PipelineParallelConfig"] == _exports.UTILS["TorchTensorParallelConfig"]
    assert "PipelineParallelConfig" in accel.utils.__all__

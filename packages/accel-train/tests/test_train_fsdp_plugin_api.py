"""The documented FullyShardedDataParallelPlugin API: fields hold torch's FSDP types after
construction, the reference release's methods, and "train sharded, save the final model full"."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from fsdp_helpers import BlockNet, regression_batches
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    FullStateDictConfig,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train import FullyShardedDataParallelPlugin
from accel_train.strategies.fsdp.plugin import setting_name

# -- fields ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("FULL_SHARD", ShardingStrategy.FULL_SHARD),
        ("shard_grad_op", ShardingStrategy.SHARD_GRAD_OP),
        (3, ShardingStrategy.NO_SHARD),
        ("HYBRID_SHARD_ZERO2", ShardingStrategy._HYBRID_SHARD_ZERO2),
        (ShardingStrategy.HYBRID_SHARD, ShardingStrategy.HYBRID_SHARD),
    ],
)
def test_sharding_strategy_is_torchs_enum(given: object, expected: ShardingStrategy) -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy=given)
    assert plugin.sharding_strategy == expected
    assert setting_name(plugin.sharding_strategy) == expected.name.lstrip("_")


def test_prefetch_and_state_dict_type_are_torchs_enums() -> None:
    plugin = FullyShardedDataParallelPlugin(backward_prefetch="backward_post", state_dict_type="SHARDED_STATE_DICT")
    assert plugin.backward_prefetch == BackwardPrefetch.BACKWARD_POST
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert FullyShardedDataParallelPlugin(backward_prefetch="NO_PREFETCH").backward_prefetch is None
    assert FullyShardedDataParallelPlugin(backward_prefetch=BackwardPrefetch.BACKWARD_PRE).backward_prefetch == (
        BackwardPrefetch.BACKWARD_PRE
    )
    with pytest.raises(ValueError, match="backward_prefetch='SIDEWAYS' is not valid; choose one of"):
        FullyShardedDataParallelPlugin(backward_prefetch="SIDEWAYS")


def test_fsdp2_backward_prefetch_warns_and_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, backward_prefetch="BACKWARD_PRE")
    assert plugin.backward_prefetch is None
    assert "backward_prefetch=BACKWARD_PRE is FSDP1 only" in caplog.text


def test_policies_are_torchs_objects_after_construction() -> None:
    v1 = FullyShardedDataParallelPlugin(
        fsdp_version=1, mixed_precision_policy={"param_dtype": "bf16"}, cpu_offload=True
    )
    assert v1.mixed_precision_policy == MixedPrecision(param_dtype=torch.bfloat16)
    assert v1.cpu_offload == CPUOffload(offload_params=True)
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="fp16")
    # One dtype name means the outputs too, as the documented plugin builds it.
    assert v2.mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.float16, reduce_dtype=torch.float16, output_dtype=torch.float16
    )
    assert type(v2.cpu_offload) is OffloadPolicy
    assert FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True).cpu_offload == CPUOffloadPolicy()
    assert FullyShardedDataParallelPlugin().mixed_precision_policy is None
    with pytest.raises(ValueError, match="unknown keys"):
        FullyShardedDataParallelPlugin(mixed_precision_policy={"param_type": "bf16"})


# -- methods -----------------------------------------------------------------------------------------


def test_set_state_dict_type_switches_type_and_configs() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert isinstance(plugin.state_dict_config, ShardedStateDictConfig)
    plugin.set_state_dict_type("FULL_STATE_DICT")
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert isinstance(plugin.state_dict_config, FullStateDictConfig) and plugin.state_dict_config.rank0_only
    plugin.set_state_dict_type(StateDictType.SHARDED_STATE_DICT)
    assert isinstance(plugin.state_dict_config, ShardedStateDictConfig)
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT is FSDP1 only"):
        plugin.set_state_dict_type("LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="state_dict_type='HALF' is not valid"):
        plugin.set_state_dict_type("HALF")


def test_set_state_dict_type_without_argument_reads_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type="SHARDED_STATE_DICT")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "LOCAL_STATE_DICT")
    plugin.set_state_dict_type()
    assert plugin.state_dict_type == StateDictType.LOCAL_STATE_DICT


def test_set_mixed_precision() -> None:
    v1 = FullyShardedDataParallelPlugin(fsdp_version=1)
    v1.set_mixed_precision("bf16")
    assert v1.mixed_precision_policy == MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16
    )
    v1.set_mixed_precision("fp16")  # an existing policy wins without override
    assert v1.mixed_precision_policy.param_dtype == torch.bfloat16
    v1.set_mixed_precision("fp16", buffer_autocast=True, override=True)
    assert v1.mixed_precision_policy == MixedPrecision(
        param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float32
    )
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    v2.set_mixed_precision(torch.bfloat16)
    assert v2.mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.bfloat16
    )
    with pytest.raises(ValueError, match="unknown mode; choose one of"):
        v2.set_mixed_precision("fp12", override=True)


def test_validate_mixed_precision_policy_refuses_other_versions_object() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.mixed_precision_policy = {"param_dtype": "bf16"}
    plugin.validate_mixed_precision_policy()
    assert plugin.mixed_precision_policy == MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    plugin.mixed_precision_policy = MixedPrecision()
    with pytest.raises(ValueError, match="FSDP1 MixedPrecision but fsdp_version=2"):
        plugin.validate_mixed_precision_policy()


def test_set_and_validate_cpu_offload() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1)
    plugin.cpu_offload = True
    plugin.set_cpu_offload()
    assert plugin.cpu_offload == CPUOffload(offload_params=True)
    plugin.validate_cpu_offload()
    plugin.cpu_offload = CPUOffloadPolicy()
    with pytest.raises(ValueError, match="does not fit fsdp_version=1; give CPUOffload"):
        plugin.validate_cpu_offload()
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    v2.cpu_offload = "true"
    v2.set_cpu_offload()
    assert v2.cpu_offload == CPUOffloadPolicy()


def test_set_auto_wrap_policy_resolves_against_the_model() -> None:
    model = BlockNet()
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"])
    plugin.set_auto_wrap_policy(model)
    policy = plugin.auto_wrap_policy
    assert callable(policy) and not isinstance(policy, str)
    plugin.set_auto_wrap_policy(model)  # already a callable: kept
    assert plugin.auto_wrap_policy is policy
    size = FullyShardedDataParallelPlugin(min_num_params=10)
    size.set_auto_wrap_policy(model)
    assert callable(size.auto_wrap_policy)
    with pytest.raises(ValueError, match="Nope"):
        FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Nope"]).set_auto_wrap_policy(model)


def test_set_auto_wrap_policy_stores_torchs_policy_function_for_scripts_to_read() -> None:
    import functools

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    from accel_train.strategies.fsdp.wrap import wrap_units

    model = BlockNet()
    layers = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    layers.set_auto_wrap_policy(model)
    policy = layers.auto_wrap_policy
    assert isinstance(policy, functools.partial) and policy.func is transformer_auto_wrap_policy
    assert policy.keywords == {"transformer_layer_cls": {type(model.blocks[0])}}
    # FSDP2 shards the units the stored policy names, as FSDP1 wraps them
    assert wrap_units(model, layers) == list(model.blocks)
    size = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=10)
    size.set_auto_wrap_policy(model)
    assert size.auto_wrap_policy.func is size_based_auto_wrap_policy
    assert size.auto_wrap_policy.keywords == {"min_num_params": 10}


def test_min_num_params_0_means_no_size_based_wrapping() -> None:
    from accel_train.strategies.fsdp.wrap import wrap_units

    model = BlockNet()
    for version in (1, 2):
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=version, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=0
        )
        assert wrap_units(model, plugin) == []  # the whole model is one unit, not one unit per module
        plugin.set_auto_wrap_policy(model)
        assert plugin.auto_wrap_policy is None
    small = FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1)
    assert len(wrap_units(model, small)) > 1


# -- on two processes ---------------------------------------------------------------------------------


def rank_train_sharded_save_full(version: int, folder: str) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision="bf16")
    policy_type = type(plugin.mixed_precision_policy).__name__
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index
    for x, y in regression_batches(2, 4):
        accelerator.backward(
            torch.nn.functional.mse_loss(model(x[rank * 2 : rank * 2 + 2]), y[rank * 2 : rank * 2 + 2])
        )
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(os.path.join(folder, "sharded"))
    plugin.set_state_dict_type("FULL_STATE_DICT")
    state = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    accelerator.save_model(model, os.path.join(folder, "final"))
    accelerator.save_state(os.path.join(folder, "full"))
    accelerator.wait_for_everyone()
    return {"state": state, "policy": policy_type}


@pytest.mark.parametrize("version", [1, 2])
def test_train_sharded_then_save_the_final_model_full(dist_pool: DistributedPool, tmp_path, version: int) -> None:
    from accel_train.checkpoint.file_io import load_weights

    results = dist_pool.run(rank_train_sharded_save_full, version, str(tmp_path))
    assert [r["policy"] for r in results] == [("MixedPrecision" if version == 1 else "MixedPrecisionPolicy")] * 2
    assert "pytorch_model_fsdp_0" in os.listdir(tmp_path / "sharded")
    full = set(os.listdir(tmp_path / "full"))
    assert "pytorch_model_fsdp_0" not in full and "model.safetensors" in full
    expected = results[0]["state"]
    assert set(expected) == {k for k in BlockNet().state_dict()}
    for saved in (
        load_weights(str(tmp_path / "final" / "model.safetensors")),
        load_weights(str(tmp_path / "full" / "model.safetensors")),
    ):
        assert set(saved) == set(expected)
        assert all(torch.equal(saved[k].float(), expected[k].float()) for k in expected)

"""Kwargs handlers, plugins and configurations: validation with errors that name the wrong field."""

from __future__ import annotations

import pytest
from torch.distributed.fsdp import ShardingStrategy

from accel_train.kwargs_handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    ProfileKwargs,
)
from accel_train.parallel_plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    ParallelismConfig,
    TorchTensorParallelPlugin,
)
from accel_train.plugins import GradientAccumulationPlugin, ProjectConfiguration, TorchDynamoPlugin


def test_ddp_kwargs_only_changed_fields_reach_ddp() -> None:
    handler = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="fp16")
    assert handler.comm_hook is DDPCommunicationHookType.FP16
    assert handler.ddp_arguments() == {"find_unused_parameters": True}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"comm_hook": "fp8"}, "comm_hook='fp8'"),
        ({"comm_hook": "fp16", "comm_wrapper": "bf16"}, "comm_wrapper only applies to the PowerSGD"),
        ({"comm_hook": "power_sgd", "comm_wrapper": "power_sgd"}, "comm_wrapper"),
        ({"comm_state_option": {"matrix_approximation_rank": 2}}, "comm_state_option only applies"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb"),
    ],
)
def test_ddp_kwargs_reject_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistributedDataParallelKwargs(**kwargs)


def test_scaler_and_autocast_kwargs_validate() -> None:
    assert GradScalerKwargs(init_scale=1024).to_kwargs() == {"init_scale": 1024}
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScalerKwargs(backoff_factor=2.0)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScalerKwargs(growth_factor=1.0)
    with pytest.raises(TypeError, match="enabled"):
        AutocastKwargs(enabled="yes")  # type: ignore[arg-type]


def test_profile_kwargs_validate_activities_and_schedule() -> None:
    with pytest.raises(ValueError, match="activities"):
        ProfileKwargs(activities=["gpu"])
    with pytest.raises(ValueError, match="schedule_option key"):
        ProfileKwargs(schedule_option={"active": 1, "pause": 2})
    with pytest.raises(ValueError, match="'active' key"):
        ProfileKwargs(schedule_option={"wait": 1})
    ProfileKwargs(activities=["cpu"], schedule_option={"wait": 1, "warmup": 1, "active": 2})


def test_fp8_recipe_validates() -> None:
    assert FP8RecipeKwargs(backend="te", fp8_format="e4m3").fp8_format == "E4M3"
    with pytest.raises(ValueError, match="backend"):
        FP8RecipeKwargs(backend="cuda")


def test_gradient_accumulation_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GradientAccumulationPlugin(num_steps=4).num_steps == 4
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3")
    assert GradientAccumulationPlugin().num_steps == 3
    with pytest.raises(ValueError, match="num_steps must be an int >= 1"):
        GradientAccumulationPlugin(num_steps=0)
    with pytest.raises(TypeError, match="sync_each_batch"):
        GradientAccumulationPlugin(num_steps=2, sync_each_batch="no")  # type: ignore[arg-type]


def test_dynamo_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not TorchDynamoPlugin().enabled
    plugin = TorchDynamoPlugin(backend="eager", fullgraph=True)
    assert plugin.enabled and plugin.to_compile_kwargs() == {"backend": "eager", "fullgraph": True, "mode": "default"}
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    assert TorchDynamoPlugin().to_compile_kwargs()["mode"] == "max-autotune"
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        TorchDynamoPlugin(backend="turbo")
    with pytest.raises(ValueError, match="mode='fast'"):
        TorchDynamoPlugin(backend="eager", mode="fast")


def test_project_configuration(tmp_path) -> None:
    config = ProjectConfiguration(project_dir=tmp_path)
    assert config.logging_dir == str(tmp_path)
    config.set_directories(tmp_path / "other")
    assert config.logging_dir == str(tmp_path / "other")
    with pytest.raises(ValueError, match="total_limit"):
        ProjectConfiguration(total_limit=0)
    with pytest.raises(ValueError, match="iteration"):
        ProjectConfiguration(iteration=-1)


def test_parallel_plugins_validate() -> None:
    assert (
        FullyShardedDataParallelPlugin(sharding_strategy="full_shard").sharding_strategy == ShardingStrategy.FULL_SHARD
    )
    with pytest.raises(ValueError, match="sharding_strategy"):
        FullyShardedDataParallelPlugin(sharding_strategy="HALF_SHARD")
    with pytest.raises(ValueError, match="fsdp_version"):
        FullyShardedDataParallelPlugin(fsdp_version=3)
    with pytest.raises(ValueError, match="reshard_after_forward"):
        FullyShardedDataParallelPlugin(fsdp_version=2, sharding_strategy="FULL_SHARD")
    with pytest.raises(ValueError, match="zero_stage"):
        DeepSpeedPlugin(zero_stage=4)
    # as documented: zero3_init_flag below ZeRO-3 is turned off (with a warning), from code as from the launcher
    assert DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).zero3_init_flag is False
    with pytest.raises(ValueError, match="offload_optimizer_device"):
        DeepSpeedPlugin(offload_optimizer_device="gpu")
    with pytest.raises(ValueError, match="tp_degree"):
        MegatronLMPlugin(tp_degree=0)
    with pytest.raises(ValueError, match="tp_size"):
        TorchTensorParallelPlugin(tp_size=0)
    config = ParallelismConfig(tp_size=2)
    assert config.total_size == 2 and not config.is_trivial
    with pytest.raises(ValueError, match="cp_size"):
        ParallelismConfig(cp_size=0)

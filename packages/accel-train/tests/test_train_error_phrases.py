"""Errors of accel-train carry the documented system's key phrase (what users paste into a search)."""

from __future__ import annotations

import pytest
import torch

from accel_state.testing import reset_shared_state
from accel_train import Accelerator


def test_load_state_into_another_model_says_error_in_loading_state_dict(tmp_path) -> None:
    reset_shared_state()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(3, 3))
    accelerator.save_state(tmp_path / "ckpt")
    reset_shared_state()
    other = Accelerator(cpu=True)
    other.prepare(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    with pytest.raises(
        RuntimeError, match=r"Error\(s\) in loading state_dict for Sequential: .*missing keys \['0.weight'"
    ):
        other.load_state(tmp_path / "ckpt")
    reset_shared_state()


def test_missing_and_existing_checkpoint_folders_use_the_documented_wording(tmp_path) -> None:
    from accel_train import ProjectConfiguration

    reset_shared_state()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match=r"Tried to find .*nowhere but folder does not exist"):
        accelerator.load_state(tmp_path / "nowhere")
    reset_shared_state()
    config = ProjectConfiguration(project_dir=str(tmp_path / "run"), automatic_checkpoint_naming=True)
    numbered = Accelerator(cpu=True, project_config=config)
    numbered.prepare(torch.nn.Linear(2, 2))
    numbered.save_state()
    numbered.project_configuration.iteration = 0
    with pytest.raises(ValueError, match=r"Checkpoint directory .*checkpoint_0 \(0\) already exists"):
        numbered.save_state()
    reset_shared_state()


def test_both_accumulation_settings_say_only_one() -> None:
    from accel_train import GradientAccumulationPlugin

    reset_shared_state()
    with pytest.raises(ValueError, match="You can only pass one of `GradientAccumulationPlugin` and"):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )
    reset_shared_state()


# -- DeepSpeed and FSDP validation errors: accel's wording plus the documented key sentence ------------


def test_deepspeed_config_errors_carry_the_documented_sentence() -> None:
    from accel_train import deepspeed_config as dsc
    from accel_train.deepspeed_plugin import DeepSpeedPlugin

    with pytest.raises(ValueError, match="Please specify the ZeRO optimization config in the DeepSpeed config"):
        DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 2})
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0})
    with pytest.raises(ValueError, match="Please correct the following DeepSpeed config values that mismatch kwargs"):
        plugin.deepspeed_config_process(gradient_clipping=2.0)
    with pytest.raises(
        ValueError, match=r"When using `deepspeed_config_file`, the following accelerate config variables will be "
    ):
        dsc.check_config_file_fields(["zero_stage"])
    with pytest.raises(
        ValueError, match="`--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config"
    ):
        dsc.resolve_mixed_precision({"fp16": {"enabled": True}}, "bf16")


def test_deepspeed_batch_size_errors_carry_the_documented_sentence() -> None:
    from accel_train import deepspeed_config as dsc

    with pytest.raises(ValueError, match="At least one of the dataloaders passed to `prepare\\(\\)` has `None`"):
        dsc.micro_batch_size([4, None])
    with pytest.raises(ValueError, match="requires you to pass at least one of training or evaluation dataloaders"):
        dsc.resolve_batch_sizes({"train_micro_batch_size_per_gpu": "auto"}, None, 1, 2)


def test_deepspeed_clip_grad_value_carries_the_documented_sentence() -> None:
    from accel_state.imports import is_deepspeed_available

    if not is_deepspeed_available():
        pytest.skip("needs DeepSpeed")
    from accel_train.deepspeed_plugin import DeepSpeedPlugin

    reset_shared_state()
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    with pytest.raises(ValueError, match="DeepSpeed and FSDP do not support `clip_grad_value_`. Use `clip_grad_norm_`"):
        accelerator.clip_grad_value_([torch.nn.Parameter(torch.ones(1))], 1.0)
    reset_shared_state()


def test_fsdp_plugin_errors_carry_the_documented_sentence() -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    from accel_train import FullyShardedDataParallelPlugin

    with pytest.raises(ValueError, match="FSDP2 does not support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type`"):
        FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="Set the `sync_module_states` flag to `True` so that model states are synced"):
        FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True, sync_module_states=False)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1)
    plugin.cpu_offload = CPUOffloadPolicy()
    with pytest.raises(
        ValueError, match=r"`cpu_offload` must be an instance of `torch.distributed.fsdp.CPUOffload` in FSDP1"
    ):
        plugin.validate_cpu_offload()

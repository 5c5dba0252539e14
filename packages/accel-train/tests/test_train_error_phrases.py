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

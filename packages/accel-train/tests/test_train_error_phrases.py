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

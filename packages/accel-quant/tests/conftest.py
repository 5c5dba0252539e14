"""Fixtures of accel-quant's tests: a tiny model, its tokens and its fp32 checkpoint."""

from __future__ import annotations

import os

import pytest
import torch
from quant_models import TinyLM


@pytest.fixture
def tiny_model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM().eval()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def checkpoint(tmp_path, tiny_model) -> str:
    """A folder holding ``model.safetensors`` with the fp32 weights of ``tiny_model``."""
    from safetensors.torch import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(tiny_model.state_dict(), os.fspath(folder / "model.safetensors"))
    return os.fspath(folder)

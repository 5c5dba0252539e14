"""Fixtures of accel-quant's tests: a tiny model, its tokens and its fp32 checkpoint."""

from __future__ import annotations

import os

import pytest
import torch
from quant_models import TinyLM


@pytest.fixture(autouse=True)
def _bnb_tests_target_the_cpu(request, monkeypatch) -> None:
    """The bitsandbytes tests here check the CPU path; on a machine with a GPU they would load onto it.

    With no device map, ``load_and_quantize_model`` targets the current accelerator; these tests keep the
    CPU as that target so they mean the same everywhere. ``test_bnb_gpu.py`` covers the CUDA path.
    """
    if torch.cuda.is_available() and request.node.path.name != "test_bnb_gpu.py":
        import accel_quant.bnb as bnb_loading

        monkeypatch.setattr(bnb_loading, "_default_device", lambda: "cpu")


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

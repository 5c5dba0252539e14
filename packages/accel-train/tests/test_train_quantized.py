"""Accelerator.save_model of a bitsandbytes 8-bit model, loaded back quantized by accel-quant (CPU, for real)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from accel_train import Accelerator

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed (accel-quant[bnb])"
)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
    )


def test_save_model_of_8bit_model_reloads_quantized(tmp_path) -> None:
    import bitsandbytes as bnb

    from accel_bigmodel.empty import init_empty_weights
    from accel_quant import BnbQuantizationConfig, load_and_quantize_model

    torch.manual_seed(0)
    config = BnbQuantizationConfig(load_in_8bit=True)
    quantized = load_and_quantize_model(_model(), config)
    Accelerator(cpu=True).save_model(quantized, tmp_path / "saved")
    with init_empty_weights():
        empty = _model()
    reloaded = load_and_quantize_model(empty, config, weights_location=tmp_path / "saved")
    assert isinstance(reloaded[2], bnb.nn.Linear8bitLt) and reloaded[2].weight.dtype == torch.int8
    assert torch.equal(reloaded[2].weight.SCB, quantized[2].weight.SCB)
    inputs = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(reloaded(inputs), quantized(inputs))

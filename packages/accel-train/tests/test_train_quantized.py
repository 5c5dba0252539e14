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


class _WithAdapter(torch.nn.Module):
    """A quantized body under a small trainable head (what peft's adapters amount to)."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body
        self.adapter = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(self.body(x))


def test_prepare_refuses_a_pure_quantized_model_and_trains_one_with_adapters() -> None:
    from accel_quant import BnbQuantizationConfig, load_and_quantize_model

    torch.manual_seed(0)
    quantized = load_and_quantize_model(_model(), BnbQuantizationConfig(load_in_8bit=True))
    for param in quantized.parameters():
        param.requires_grad_(False)
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="not possible to train a pure 8-bit or 4-bit model"):
        accelerator.prepare(quantized)
    assert accelerator.prepare_model(quantized, evaluation_mode=True) is quantized  # inference is fine

    model = _WithAdapter(quantized)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = model.adapter.weight.detach().clone()
    accelerator.backward(model(torch.randn(4, 32)).pow(2).mean())
    optimizer.step()
    assert not torch.equal(model.adapter.weight, before)

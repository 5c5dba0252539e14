"""Training a quantized model: refused without adapters, allowed (and it trains) with them."""

from __future__ import annotations

import copy

import pytest
import torch
from quant_models import TinyLM, requires_bnb
from torch import nn

from accel_quant.bnb import load_and_quantize_model
from accel_quant.bnb_config import BnbQuantizationConfig
from accel_quant.training import PURE_QUANTIZED_MESSAGE, check_trainable_quantized_model, is_bnb_quantized

pytestmark = requires_bnb


class LoRA(nn.Module):
    """A frozen (quantized) layer plus a trainable low-rank update."""

    def __init__(self, base: nn.Module, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Linear(base.in_features, rank, bias=False)
        self.b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(x))


def _quantized(config: dict, model: TinyLM) -> nn.Module:
    quantized = load_and_quantize_model(copy.deepcopy(model), BnbQuantizationConfig(**config))
    quantized.requires_grad_(False)
    return quantized


def test_plain_model_is_not_checked() -> None:
    model = TinyLM()
    model.requires_grad_(False)
    assert not is_bnb_quantized(model)
    check_trainable_quantized_model(model)


@pytest.mark.parametrize(
    "config", [{"load_in_8bit": True}, {"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.float32}]
)
def test_pure_quantized_model_is_refused(config, tiny_model) -> None:
    model = _quantized(config, tiny_model)
    assert is_bnb_quantized(model)
    with pytest.raises(ValueError) as err:
        check_trainable_quantized_model(model, device="cpu")
    assert str(err.value) == PURE_QUANTIZED_MESSAGE
    assert "adapters" in PURE_QUANTIZED_MESSAGE and "8-bit or 4-bit" in PURE_QUANTIZED_MESSAGE


@pytest.mark.parametrize(
    "config", [{"load_in_8bit": True}, {"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.float32}]
)
def test_adapters_make_it_trainable(config, tiny_model, tokens) -> None:
    model = _quantized(config, tiny_model)
    for block in model.blocks:
        block.up = LoRA(block.up)
    check_trainable_quantized_model(model, device="cpu")

    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    target = torch.randint(0, 100, tokens.shape, generator=torch.Generator().manual_seed(3))
    model.train()
    losses = []
    for _ in range(8):
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for name, param in model.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name  # quantized weights untouched


def test_offloaded_quantized_model_is_refused(tiny_model) -> None:
    model = _quantized({"load_in_8bit": True}, tiny_model)
    model.head.requires_grad_(True)
    model.hf_device_map = {"embed": "cpu", "blocks": "disk", "norm": "cpu", "head": "cpu"}
    with pytest.raises(ValueError, match="offloaded to the CPU or disk"):
        check_trainable_quantized_model(model)


def test_spread_model_refused_in_distributed_run(tiny_model) -> None:
    model = _quantized({"load_in_8bit": True}, tiny_model)
    model.head.requires_grad_(True)
    model.hf_device_map = {"embed": 0, "blocks": 1, "norm": 1, "head": 1}
    check_trainable_quantized_model(model, distributed=False)
    with pytest.raises(ValueError, match="several devices"):
        check_trainable_quantized_model(model, distributed=True)


def test_model_on_another_device_is_refused(tiny_model) -> None:
    model = _quantized({"load_in_8bit": True}, tiny_model)
    model.head.requires_grad_(True)
    with pytest.raises(ValueError, match="is on cpu but training runs on cuda:1"):
        check_trainable_quantized_model(model, device="cuda:1")

"""FP8 training with torchao on CPU for real (float8 matmuls emulated: no float8 hardware here)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from quant_models import requires_torchao
from torch import nn

from accel_quant.fp8.ao import (
    build_ao_config,
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
from accel_quant.fp8.recipes import AORecipe

pytestmark = requires_torchao


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16)
    )


def _float8_names(model: nn.Module) -> list[str]:
    from torchao.float8.float8_linear import Float8Linear

    return [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]


def test_first_and_last_kept_by_default(caplog) -> None:
    model = _mlp()
    assert find_first_last_linear_layers(model) == ("0", "6")
    with caplog.at_level(logging.WARNING, logger="accel_quant.fp8.ao"):
        convert_model_to_fp8_ao(model)
    assert _float8_names(model) == ["2", "4"]
    assert has_ao_layers(model) and not has_ao_layers(_mlp())
    messages = [r.getMessage() for r in caplog.records if "left in high precision" in r.getMessage()]
    assert len(messages) == 1 and "0 (first)" in messages[0] and "6 (last)" in messages[0]


def test_dimensions_not_multiple_of_16_stay_high_precision(caplog) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 40), nn.Linear(40, 32), nn.Linear(32, 32), nn.Linear(32, 16))
    with caplog.at_level(logging.WARNING, logger="accel_quant.fp8.ao"):
        convert_model_to_fp8_ao(model)
    assert _float8_names(model) == ["3"]
    (message,) = [r.getMessage() for r in caplog.records if "left in high precision" in r.getMessage()]
    assert "1 (32x40 not multiples of 16)" in message and "2 (40x32 not multiples of 16)" in message


def test_custom_filter_and_config() -> None:
    model = _mlp()
    config = build_ao_config(AORecipe(pad_inner_dim=False, enable_fsdp_float8_all_gather=False))
    from accel_quant.fp8.recipes import has_fp8_tensor_cores

    assert config.emulate is (not has_fp8_tensor_cores()) and config.pad_inner_dim is False
    convert_model_to_fp8_ao(model, config=config, module_filter_func=lambda m, fqn: fqn in ("0", "6"))
    assert _float8_names(model) == ["0", "6"]


def test_first_last_filter_outside_a_conversion_checks_dimensions_only() -> None:
    assert filter_first_and_last_linear_layers(nn.Linear(16, 32), "x") is True
    assert filter_first_and_last_linear_layers(nn.Linear(16, 30), "x") is False


def _train(model: nn.Module, autocast_dtype: torch.dtype | None, steps: int = 80) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(128, 32, generator=generator)
    targets = inputs @ torch.randn(32, 16, generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss = nn.functional.mse_loss(model(inputs).float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_fp8_training_converges_close_to_bf16() -> None:
    base = _mlp()
    fp8 = convert_model_to_fp8_ao(copy.deepcopy(base))
    fp8_losses = _train(fp8, None)
    bf16_losses = _train(copy.deepcopy(base), torch.bfloat16)
    assert fp8_losses[-1] < 0.15 * fp8_losses[0]  # measured: 31.2 -> 2.7
    # same start (same weights); after 80 steps within 25% of the bf16 loss (measured 2.69 vs 2.43)
    assert fp8_losses[0] == pytest.approx(bf16_losses[0], rel=0.05)
    assert fp8_losses[-1] == pytest.approx(bf16_losses[-1], rel=0.25)
    grads_reached = [p for n, p in fp8.named_parameters() if n.startswith("2.")]
    assert grads_reached and all(p.grad is None for p in grads_reached)  # zeroed after the last step


def test_missing_torchao_names_the_extra(monkeypatch) -> None:
    from accel_quant import _requirements

    monkeypatch.setattr(_requirements, "is_torchao_available", lambda: False)
    with pytest.raises(ImportError, match=r"accel-quant\[torchao\]"):
        convert_model_to_fp8_ao(_mlp())

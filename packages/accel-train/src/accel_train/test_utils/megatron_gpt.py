"""A tiny GPT trained through ``Accelerator(megatron_lm_plugin=...)`` and the same megatron-core model
trained in plain PyTorch (``torch.optim.AdamW``, the loss computed by hand): the GPU check of the
Megatron-LM strategy at tp = pp = 1. Needs CUDA and megatron-core."""

from __future__ import annotations

import types
from typing import Any

import torch

__all__ = ["TINY_GPT", "compare_with_plain_pytorch"]

#: Sizes of the tiny GPT (a transformers GPT-2 config's names).
TINY_GPT: dict[str, Any] = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": 128,
    "n_positions": 32,
}


class _ConfigOnly(torch.nn.Module):
    """Stands for the transformers model whose config gives the sizes (its weights are not used)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(**TINY_GPT)
        self.anchor = torch.nn.Parameter(torch.zeros(1))


def _batches(steps: int, batch: int = 4, seq: int = 32) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, int(TINY_GPT["vocab_size"]), (batch, seq), generator=generator).cuda()}
        for _ in range(steps)
    ]


def compare_with_plain_pytorch(steps: int = 5, lr: float = 1e-3) -> tuple[list[float], list[float]]:
    """Losses of ``steps`` steps through the Accelerator, and of the same model and batches by hand."""
    from accel_train import Accelerator
    from accel_train.strategies.megatron import MegatronLMDummyScheduler, MegatronLMPlugin

    plugin = MegatronLMPlugin(
        gradient_clipping=0.0,
        lr_decay_style="constant",
        other_megatron_args={"hidden_dropout": 0.0, "attention_dropout": 0.0},
    )
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    stub = _ConfigOnly()
    optimizer = torch.optim.AdamW(stub.parameters(), lr=lr, weight_decay=0.0)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=100)
    model, optimizer, scheduler = accelerator.prepare(stub, optimizer, scheduler)
    reference = _same_model(model.module[0].module, stub, plugin)
    batches = _batches(steps)
    losses = []
    for batch in batches:
        output = model(**batch)
        accelerator.backward(output.loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(output.loss.item())
    return losses, _by_hand(reference, batches, lr)


def _same_model(prepared: torch.nn.Module, stub: torch.nn.Module, plugin: Any) -> torch.nn.Module:
    """A second bare megatron-core model of the prepared one's config, holding a copy of its weights.

    ``copy.deepcopy`` cannot be used: megatron-core's modules hold process groups, which do not copy.
    """
    from accel_train.strategies.megatron import config as translate
    from accel_train.strategies.megatron.strategy import _core_model

    other = plugin.other_megatron_args or {}
    facts = translate.model_facts(stub.config, other)
    reference = _core_model(facts, prepared.config, other, True, True, None).cuda()
    reference.load_state_dict(prepared.state_dict(), strict=True)
    return reference


def _by_hand(model: Any, batches: list[dict[str, torch.Tensor]], lr: float) -> list[float]:
    from accel_train.strategies.megatron import GPTTrainStep

    step = GPTTrainStep(None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for batch in batches:
        tokens, labels, loss_mask, attention_mask, position_ids = step.get_batch(iter([batch]))
        per_token = model(tokens, position_ids, attention_mask, labels=labels)
        loss = (per_token.float().reshape(-1) * loss_mask.reshape(-1)).sum() / loss_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses

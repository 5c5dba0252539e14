"""Test helpers of accel-quant: a tiny transformer-like model and skips for missing backends."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

requires_bnb = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed (accel-quant[bnb])"
)
requires_torchao = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="torchao is not installed (accel-quant[torchao])"
)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class TinyLM(nn.Module):
    """Embedding, three residual MLP blocks, a LayerNorm and an output head: 64 wide, 100 tokens."""

    def __init__(self, width: int = 64, vocab: int = 100, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

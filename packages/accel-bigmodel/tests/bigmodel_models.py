"""Small models shared by the tests (importable by worker processes), and what the checkpoint tests share:
a planted pickle payload and a state copy."""

from __future__ import annotations

import os

import torch
from torch import nn


class Payload:
    """Unpickling this runs ``os.system`` (a real exploit shape); accel must never do it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def state_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state, to compare after a load."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Block(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.b(torch.relu(self.a(x))))


class Net(nn.Module):
    def __init__(self, blocks: int = 4, width: int = 16, tie: bool = False):
        super().__init__()
        self.embed = nn.Embedding(32, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(blocks)])
        self.head = nn.Linear(width, 32, bias=False)
        self.register_buffer("scale", torch.ones(width))
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.scale
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Mlp(nn.Module):
    def __init__(self, depth: int = 4, width: int = 8):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def make_net(seed: int = 0, **kwargs: object) -> Net:
    torch.manual_seed(seed)
    return Net(**kwargs)  # type: ignore[arg-type]

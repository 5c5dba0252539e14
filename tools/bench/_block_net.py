"""The small transformer-like block model the FSDP benchmarks share (import torch lazily)."""

from __future__ import annotations

from typing import Any


def block_net(width: int, depth: int) -> Any:
    """``depth`` residual MLP blocks of ``width`` (hidden 4x) and a scalar head, seeded."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(depth)])
            self.head = torch.nn.Linear(width, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    return Net()

"""Shared pieces of accel-train's tests (importable by the rank functions of DistributedPool)."""

from __future__ import annotations

import torch


class TinyNet(torch.nn.Module):
    """Two layers with dropout, so RNG state matters to resumption."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, width)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def regression_dataset(n: int = 48, seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3
    return torch.utils.data.TensorDataset(x, y)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def train_epoch(accelerator, model: torch.nn.Module, optimizer, loader) -> None:
    """One pass over ``loader``: MSE loss, ``accelerator.backward``, an optimizer step per batch."""
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def fp8_mlp() -> torch.nn.Sequential:
    """A seeded MLP whose linear layers torchao converts to float8 (dimensions multiples of 16)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 16),
    )

"""Fixtures of accel-train's tests: pools of real gloo processes, and fresh shared state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[DistributedPool]:
    with DistributedPool(world_size=2, timeout=180) as pool:
        yield pool


@pytest.fixture(scope="session")
def pools() -> Iterator[Callable[[int], DistributedPool]]:
    """Pools of any size, opened on first use and kept for the test session (resharding tests need
    1, 2 and 4 processes; the 4-D parallelism tests 4). Kept across modules: starting four processes that
    import torch costs about 11 CPU-s, and their first optimizer as much again; every rank function starts
    with ``reset_shared_state()``, as on ``dist_pool``, which is shared the same way."""
    opened: dict[int, DistributedPool] = {}

    def get(world: int) -> DistributedPool:
        if world not in opened:
            opened[world] = DistributedPool(world_size=world, timeout=600).start()
        return opened[world]

    yield get
    for pool in opened.values():
        pool.close()


@pytest.fixture
def pool4(pools: Callable[[int], DistributedPool]) -> DistributedPool:
    """The session's pool of four processes (``pools(4)``)."""
    return pools(4)


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test starts and ends with no shared state in this process."""
    reset_shared_state()
    yield
    reset_shared_state()


def _step(accelerator, model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture
def saved(tmp_path) -> Iterator[tuple]:
    """``(accelerator, model, optimizer, folder)`` of one process: a checkpoint saved after one step, then
    one more step, and the torch generator moved on (the live state differs from the saved one everywhere)."""
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer, 1)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    _step(accelerator, model, optimizer, 2)
    torch.manual_seed(123)
    yield accelerator, model, optimizer, folder
    reset_shared_state()

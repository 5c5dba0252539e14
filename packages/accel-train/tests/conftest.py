"""Fixtures of accel-train's tests: pools of real gloo processes, and fresh shared state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from accel_state.testing import DistributedPool, reset_shared_state


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[DistributedPool]:
    with DistributedPool(world_size=2, timeout=180) as pool:
        yield pool


@pytest.fixture(scope="module")
def pools() -> Iterator[Callable[[int], DistributedPool]]:
    """Pools of any size, opened on first use and kept for the test module (resharding tests need
    1, 2 and 4 processes)."""
    opened: dict[int, DistributedPool] = {}

    def get(world: int) -> DistributedPool:
        if world not in opened:
            opened[world] = DistributedPool(world_size=world, timeout=600).start()
        return opened[world]

    yield get
    for pool in opened.values():
        pool.close()


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test starts and ends with no shared state in this process."""
    reset_shared_state()
    yield
    reset_shared_state()

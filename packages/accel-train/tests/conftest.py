"""Fixtures of accel-train's tests: pools of real gloo processes, and fresh shared state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

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

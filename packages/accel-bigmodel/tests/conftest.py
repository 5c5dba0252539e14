"""Fixtures of accel-bigmodel's tests: a pool of two real gloo processes, small models, temp checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accel_state.testing import DistributedPool, reset_shared_state


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[DistributedPool]:
    with DistributedPool(world_size=2) as pool:
        yield pool


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test starts and ends with no shared state in this process."""
    reset_shared_state()
    yield
    reset_shared_state()

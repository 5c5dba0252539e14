"""Fixtures of accel-data's tests: a pool of two real gloo processes shared by the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accel_state.testing import DistributedPool, reset_shared_state

try:
    # DataLoader workers are forked and seed numpy.random on start; importing it there while this process
    # has other threads (the pool's queues) can break the child's import lock. Import it once here.
    import numpy.random  # noqa: F401
except ImportError:  # pragma: no cover
    pass


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

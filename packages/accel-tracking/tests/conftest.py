"""Fixtures of accel-tracking's tests: two real gloo processes, fresh state, and a clean tracker registry."""

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
    """Each test starts and ends with no shared state in this process, and the built-in registry only."""
    from accel_tracking.registry import LOGGER_TYPE_TO_CLASS

    registry = dict(LOGGER_TYPE_TO_CLASS)
    reset_shared_state()
    yield
    reset_shared_state()
    LOGGER_TYPE_TO_CLASS.clear()
    LOGGER_TYPE_TO_CLASS.update(registry)

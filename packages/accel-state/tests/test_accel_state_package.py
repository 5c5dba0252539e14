"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_state


def test_version_matches_metadata() -> None:
    assert accel_state.__version__ == importlib.metadata.version("accel-state")

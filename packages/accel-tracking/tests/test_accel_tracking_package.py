"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_tracking


def test_version_matches_metadata() -> None:
    assert accel_tracking.__version__ == importlib.metadata.version("accel-tracking")

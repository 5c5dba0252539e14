"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_launch


def test_version_matches_metadata() -> None:
    assert accel_launch.__version__ == importlib.metadata.version("accel-launch")

"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_data


def test_version_matches_metadata() -> None:
    assert accel_data.__version__ == importlib.metadata.version("accel-data")

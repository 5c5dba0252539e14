"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_bigmodel


def test_version_matches_metadata() -> None:
    assert accel_bigmodel.__version__ == importlib.metadata.version("accel-bigmodel")

"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_train


def test_version_matches_metadata() -> None:
    assert accel_train.__version__ == importlib.metadata.version("accel-train")

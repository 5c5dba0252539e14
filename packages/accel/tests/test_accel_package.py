"""The meta-package installs and exposes its version."""

import importlib.metadata

import accel


def test_version_matches_metadata() -> None:
    assert accel.__version__ == importlib.metadata.version("accel")

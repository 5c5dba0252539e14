"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_quant


def test_version_matches_metadata() -> None:
    assert accel_quant.__version__ == importlib.metadata.version("accel-quant")

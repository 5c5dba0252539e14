"""Importing accel_data does no work, and its names resolve lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_does_not_load_torch() -> None:
    code = "import sys, accel_data; print('torch' in sys.modules, 'torchdata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_lazy_names() -> None:
    import accel_data
    from accel_data import data_loader

    assert accel_data.prepare_data_loader is data_loader.prepare_data_loader
    assert accel_data.DataLoaderConfiguration.__module__ == "accel_data.config"
    assert "skip_first_batches" in dir(accel_data)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        accel_data.nope

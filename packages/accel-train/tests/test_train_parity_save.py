"""accel.utils.save / load and the log of shared tensors removed when writing safetensors (issue 17, item 15)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from accel_train.checkpoint.file_io import load, save


def test_save_logs_the_shared_tensors_it_removes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    state = {"embed.weight": weight, "head.weight": weight, "bias": torch.ones(2)}
    with caplog.at_level(logging.WARNING, logger="accel_train.checkpoint.file_io"):
        save(state, tmp_path / "model.safetensors", safe_serialization=True)
    assert "Removed shared tensor" in caplog.text and "head.weight" in caplog.text
    loaded = load(tmp_path / "model.safetensors")
    assert set(loaded) == set(state)
    assert torch.equal(loaded["head.weight"], weight)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accel_train.checkpoint.file_io"):
        save({"a": torch.ones(1), "b": torch.zeros(1)}, tmp_path / "plain.safetensors", safe_serialization=True)
    assert "Removed shared tensor" not in caplog.text


def test_save_without_safetensors_and_load_back(tmp_path: Path) -> None:
    save({"step": 3, "values": torch.ones(2)}, tmp_path / "state.bin")
    assert load(tmp_path / "state.bin")["step"] == 3
    with pytest.raises(TypeError, match="dict of tensors"):
        save([torch.ones(1)], tmp_path / "x.safetensors", safe_serialization=True)

"""The conversion folder of a DeepSpeed checkpoint loaded on another number of processes (one process, no
DeepSpeed needed): where it goes, and the error when it cannot be written."""

from __future__ import annotations

import errno
import os

import pytest

from accel_train.checkpoint import deepspeed_universal as reshard


def _never_loads(*args: object, **kwargs: object) -> None:
    raise AssertionError("a failed conversion must not reach the engine's load")


def test_conversion_folder_lies_next_to_the_checkpoint(tmp_path) -> None:
    assert reshard.universal_dir(str(tmp_path / "ckpt")) == str(tmp_path / ".ckpt.universal")
    assert reshard.universal_dir(str(tmp_path / "ckpt") + "/") == str(tmp_path / ".ckpt.universal")


def test_unwritable_conversion_folder_is_named_with_the_reason(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "ckpt"
    (folder / "pytorch_model").mkdir(parents=True)
    (tmp_path / ".ckpt.universal").mkdir()  # left by a load killed earlier: removed first

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(reshard.os, "makedirs", refuse)
    with pytest.raises(OSError, match="Permission denied") as raised:
        reshard._prepare(str(folder), "pytorch_model")
    message = str(raised.value)
    assert str(folder) in message and ".ckpt.universal.partial" in message and "ds_to_universal.py" in message
    assert raised.value.errno == errno.EACCES
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # neither the leftover nor a partial folder stays


def test_failed_conversion_is_raised_without_a_process_group(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "ckpt"
    (folder / "pytorch_model").mkdir(parents=True)

    def broken(tag_dir: str, output: str) -> None:
        os.makedirs(output)
        raise AssertionError("Required universal_checkpoint_info state is missing")

    monkeypatch.setattr(reshard, "_convert", broken)
    with pytest.raises(AssertionError, match="universal_checkpoint_info"):
        reshard.load_resharded(
            object(), str(folder), "pytorch_model", lambda path: None, (), _never_loads, is_main_process=True
        )
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_planted_metadata_is_refused_before_conversion(tmp_path, monkeypatch) -> None:
    """DeepSpeed's converter reads every file of the engine folder: a DCP ``.metadata`` planted there (issue
    36) is refused by name before it runs, and no conversion folder is made."""
    from accel_state.errors import UnsafeCheckpointError

    engine = tmp_path / "ckpt" / "pytorch_model"
    engine.mkdir(parents=True)
    (engine / ".metadata").write_bytes(b"")
    monkeypatch.setattr(reshard, "_convert", _never_loads)
    with pytest.raises(UnsafeCheckpointError, match="inside a DeepSpeed engine folder") as raised:
        reshard._prepare(str(tmp_path / "ckpt"), "pytorch_model")
    assert raised.value.path == str(engine / ".metadata")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]

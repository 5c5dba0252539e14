"""Damaged checkpoint files (issue 37): cut short or garbled, not crafted.

Real files written by accel-bigmodel's own save (``save_sharded``, ``offload_weight``) or by
``torch.save`` are truncated or garbled, and ``load_checkpoint_in_model`` (or the offload reader) must
raise ``CorruptCheckpointError`` naming the file, what was expected and what was found, before the
model changes. A well-formed pickle asking for ``os.system`` stays an ``UnsafeCheckpointError``.
"""

from __future__ import annotations

import json
from pathlib import Path

import kill_sharded_save  # builds the test network, beside this file
import pytest
import torch
from bigmodel_models import Payload, state_values
from torch import nn

from accel_bigmodel import CorruptCheckpointError, OffloadedWeightsLoader, load_checkpoint_in_model
from accel_bigmodel.integrity import pickle_damage
from accel_bigmodel.offload import offload_weight
from accel_bigmodel.sharding import save_sharded
from accel_bigmodel.tensor_io import CheckpointError
from accel_state.errors import UnsafeCheckpointError
from accel_state.testing import pickle_record_span


def _net(seed: int = 0) -> nn.Module:
    return kill_sharded_save.net(seed)


def _assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    now = model.state_dict()
    assert set(now) == set(before)
    for name, value in before.items():
        assert torch.equal(now[name], value), f"{name} changed"


def _garble(path: Path, start: int, count: int) -> None:
    data = bytearray(path.read_bytes())
    for index in range(start, start + count):
        data[index] ^= 0x5A
    path.write_bytes(bytes(data))


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _expect_corrupt(model: nn.Module, checkpoint: Path, damaged: Path) -> CorruptCheckpointError:
    before = state_values(model)
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint_in_model(model, checkpoint)
    error = info.value
    assert error.path == str(damaged) and str(damaged) in str(error)
    assert "expected" in str(error) and "found" in str(error) and "earlier checkpoint" in str(error)
    assert isinstance(error, CheckpointError) and isinstance(error, ValueError)
    assert not isinstance(error, UnsafeCheckpointError)
    _assert_unchanged(model, before)
    return error


# -- safetensors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["half", "last_bytes", "inside_header"])
def test_truncated_safetensors_is_corrupt(tmp_path: Path, cut: str) -> None:
    save_sharded(_net(1).state_dict(), tmp_path)
    path = tmp_path / "model.safetensors"
    size = path.stat().st_size
    _truncate(path, {"half": size // 2, "last_bytes": size - 4, "inside_header": 20}[cut])
    error = _expect_corrupt(_net(0), tmp_path, path)
    assert f"{path.stat().st_size} bytes" in error.found


def test_garbled_safetensors_header_is_corrupt(tmp_path: Path) -> None:
    save_sharded(_net(1).state_dict(), tmp_path)
    path = tmp_path / "model.safetensors"
    _garble(path, 8, 40)
    error = _expect_corrupt(_net(0), tmp_path, path)
    assert "JSON" in error.expected


def test_truncated_shard_of_an_index_is_corrupt(tmp_path: Path) -> None:
    save_sharded(_net(1).state_dict(), tmp_path, max_shard_size=3000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    _truncate(shard, shard.stat().st_size - 100)
    error = _expect_corrupt(_net(0), tmp_path, shard)
    assert "records" in error.expected


def test_garbled_index_is_corrupt(tmp_path: Path) -> None:
    save_sharded(_net(1).state_dict(), tmp_path, max_shard_size=3000)
    index = next(tmp_path.glob("*.index.json"))
    index.write_bytes(b"{garbled" + index.read_bytes()[8:])
    _expect_corrupt(_net(0), tmp_path, index)


# -- torch.save files ------------------------------------------------------------------------------------


def test_truncated_bin_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.save(_net(1).state_dict(), path)
    _truncate(path, path.stat().st_size // 2)
    error = _expect_corrupt(_net(0), tmp_path, path)
    assert "zip" in error.expected


def test_garbled_pickle_in_bin_is_corrupt_not_unsafe(tmp_path: Path) -> None:
    """100 garbled bytes inside the pickle: torch's reader says "Unsupported operand", which reads like an
    attack; the record's CRC-32 shows it is damage."""
    path = tmp_path / "pytorch_model.bin"
    torch.save(_net(1).state_dict(), path)
    start, length = pickle_record_span(path)
    _garble(path, start + length // 3, 100)
    error = _expect_corrupt(_net(0), tmp_path, path)
    assert "CRC-32" in error.expected and "data.pkl" in error.expected


def test_invalid_opcode_without_crc_is_corrupt(tmp_path: Path) -> None:
    """Written without CRC-32 (torch's option), a byte that is no pickle opcode still reads as damage."""
    path = tmp_path / "pytorch_model.bin"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(_net(1).state_dict(), path)
    finally:
        torch.serialization.set_crc32_options(True)
    start, _ = pickle_record_span(path)
    data = bytearray(path.read_bytes())
    data[start + 2] = ord("x")  # right after PROTO: opcode 120 does not exist
    path.write_bytes(bytes(data))
    error = _expect_corrupt(_net(0), tmp_path, path)
    assert "pickle" in error.found


def test_planted_pickle_stays_unsafe(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "pytorch_model.bin"
    torch.save({**_net(1).state_dict(), "extra": Payload(str(marker))}, path)
    model = _net(0)
    before = state_values(model)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint_in_model(model, tmp_path)
    assert not isinstance(info.value, CorruptCheckpointError)
    assert "posix.system" in info.value.found and not marker.exists()
    _assert_unchanged(model, before)


# -- offload folders --------------------------------------------------------------------------------------


def test_garbled_offload_index_and_short_dat_are_corrupt(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    index = offload_weight(torch.ones(4), "w", folder)
    (folder / "index.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="index.json"):
        OffloadedWeightsLoader(save_folder=folder)
    (folder / "index.json").write_text(json.dumps(index))
    _truncate(folder / "w.dat", 8)
    with pytest.raises(CorruptCheckpointError, match="w.dat") as info:
        OffloadedWeightsLoader(save_folder=folder)["w"]
    assert info.value.found.startswith("8 bytes")


def test_pickle_damage_tells_broken_from_well_formed() -> None:
    import pickle

    whole = pickle.dumps({"a": [1, 2.0, "three"]}, protocol=2)
    assert pickle_damage(whole) is None
    assert pickle_damage(pickle.dumps(Payload("m"), protocol=2)) is None  # crafted, but well formed
    assert "STOP" in (pickle_damage(whole[:-1]) or "") or "exhausted" in (pickle_damage(whole[:-1]) or "")
    assert pickle_damage(whole[:2] + b"x" + whole[3:]) is not None

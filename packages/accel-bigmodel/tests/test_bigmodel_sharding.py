"""Sharded saving: the split is pure; save_sharded writes real safetensors/.bin files and indexes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from accel_bigmodel.sharding import find_shared_tensors, save_sharded, split_state_dict_into_shards


def state(n: int = 6, numel: int = 250) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(numel) for i in range(n)}  # 1000 bytes each


def test_split_respects_the_limit_in_order() -> None:
    plan = split_state_dict_into_shards(state(), max_shard_size=2500)
    assert plan.is_sharded
    assert list(plan.filename_to_tensors) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert plan.filename_to_tensors["model-00001-of-00003.safetensors"] == ["layer0.weight", "layer1.weight"]
    assert plan.metadata["total_size"] == 6000
    assert plan.tensor_to_filename["layer5.weight"] == "model-00003-of-00003.safetensors"


def test_split_single_file_and_oversized_tensor() -> None:
    plan = split_state_dict_into_shards(state(), max_shard_size="1GB")
    assert not plan.is_sharded and list(plan.filename_to_tensors) == ["model.safetensors"]
    big = {"small": torch.zeros(10), "huge": torch.zeros(1000), "after": torch.zeros(10)}
    plan = split_state_dict_into_shards(big, max_shard_size=100, filename_pattern="pytorch_model{suffix}.bin")
    assert list(plan.filename_to_tensors.values()) == [["small"], ["huge"], ["after"]]


def test_split_rejects_bad_size_and_pattern() -> None:
    with pytest.raises(ValueError, match="10 gigs"):
        split_state_dict_into_shards(state(), max_shard_size="10 gigs")
    with pytest.raises(ValueError, match="suffix"):
        split_state_dict_into_shards(state(), filename_pattern="model.safetensors")


def test_save_sharded_safetensors_with_index(tmp_path: Path) -> None:
    sd = state()
    paths = save_sharded(sd, tmp_path, max_shard_size=2500)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
            "model.safetensors.index.json",
        ]
    )
    assert len(paths) == 4
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 6000
    loaded = {}
    for name in set(index["weight_map"].values()):
        loaded.update(load_file(tmp_path / name))
    assert all(torch.equal(loaded[k], v) for k, v in sd.items())


def test_save_single_file_removes_stale_shards(tmp_path: Path) -> None:
    save_sharded(state(), tmp_path, max_shard_size=2500)
    save_sharded(state(), tmp_path, max_shard_size="10GB")
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    (tmp_path / "notes.txt").write_text("mine")
    save_sharded(state(), tmp_path, max_shard_size=2500)
    assert "notes.txt" in os.listdir(tmp_path) and "model.safetensors" not in os.listdir(tmp_path)


def test_save_bin_shards(tmp_path: Path) -> None:
    sd = state()
    save_sharded(sd, tmp_path, max_shard_size=2500, safe_serialization=False)
    assert "pytorch_model.bin.index.json" in os.listdir(tmp_path)
    shard = torch.load(tmp_path / "pytorch_model-00001-of-00003.bin", weights_only=True)
    assert torch.equal(shard["layer0.weight"], sd["layer0.weight"])


def test_shared_tensors_saved_once(tmp_path: Path) -> None:
    weight = torch.randn(4, 4)
    sd = {"embed.weight": weight, "head.weight": weight, "other": torch.randn(2)}
    assert find_shared_tensors(sd) == [["embed.weight", "head.weight"]]
    save_sharded(sd, tmp_path)
    loaded = load_file(tmp_path / "model.safetensors")
    assert set(loaded) == {"embed.weight", "other"}
    plan = split_state_dict_into_shards(sd, max_shard_size=10)
    assert plan.tensor_to_filename["embed.weight"] == plan.tensor_to_filename["head.weight"]


def test_save_into_a_file_path_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_sharded(state(), target)

"""What libraries built on the documented system rely on: fractional and in-place max_memory, relative
paths in offload indexes, and one offload file (not one per tensor) from .bin checkpoints."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    OffloadedWeightsLoader,
    disk_offload,
    get_max_memory,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accel_bigmodel.sizes import convert_file_size_to_int


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3)).eval()


def test_get_max_memory_takes_fractional_bytes_and_converts_the_given_dict_in_place() -> None:
    asked = {"cpu": 1000.9 * 0.9, "disk": "2KiB"}
    result = get_max_memory(asked)
    assert result == {"cpu": 900, "disk": 2048}
    assert asked == {"cpu": 900, "disk": 2048}  # callers read the dict back
    assert all(isinstance(v, int) for v in asked.values())
    assert convert_file_size_to_int(12.7) == 12


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.5])
def test_get_max_memory_rejects_non_finite_or_negative_floats(bad: float) -> None:
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\].*finite number of bytes"):
        get_max_memory({"cpu": bad})


def test_relative_safetensors_file_in_an_offload_index_is_relative_to_the_working_directory(
    tmp_path, monkeypatch
) -> None:
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    os.makedirs("model")
    weight = torch.arange(6.0).reshape(2, 3)
    save_file({"w": weight}, os.path.join("model", "model.safetensors"))
    os.makedirs("offload")
    index = {
        "w": {"safetensors_file": os.path.join("model", "model.safetensors"), "weight_name": "w", "dtype": "float32"}
    }
    with open(os.path.join("offload", "index.json"), "w") as f:
        json.dump(index, f)
    loader = OffloadedWeightsLoader(save_folder="offload")
    assert torch.equal(loader["w"], weight)
    # a name relative to the offload folder (accel's own older indexes) still resolves
    save_file({"v": weight * 2}, os.path.join("offload", "inside.safetensors"))
    inside = OffloadedWeightsLoader(
        save_folder="offload", index={"v": {"safetensors_file": "inside.safetensors", "weight_name": "v"}}
    )
    assert torch.equal(inside["v"], weight * 2)


def test_dispatch_with_disk_offload_from_a_relative_model_folder(tmp_path, monkeypatch) -> None:
    from safetensors.torch import save_file

    model = _model()
    x = torch.randn(4, 6)
    expected = model(x)
    monkeypatch.chdir(tmp_path)
    os.makedirs("relmodel")
    save_file(model.state_dict(), os.path.join("relmodel", "model.safetensors"))
    with init_empty_weights():
        empty = _model()
    device_map = {"0": "cpu", "1": "cpu", "2": "disk", "3": "cpu", "4": "disk"}
    loaded = load_checkpoint_and_dispatch(empty, "relmodel", device_map=device_map, offload_folder="offload")
    assert torch.allclose(loaded(x), expected)


def test_bin_checkpoint_offload_writes_one_file_not_one_per_tensor(tmp_path) -> None:
    model = _model()
    x = torch.randn(4, 6)
    expected = model(x)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with init_empty_weights():
        empty = _model()
    device_map = {"0": "disk", "1": "cpu", "2": "disk", "3": "cpu", "4": "disk"}
    offload = tmp_path / "offload"
    loaded = load_checkpoint_and_dispatch(empty, str(tmp_path), device_map=device_map, offload_folder=str(offload))
    assert torch.allclose(loaded(x), expected)
    assert glob.glob(str(offload / "*.dat")) == []
    assert len(glob.glob(str(offload / "*.safetensors"))) == 1
    assert len(json.loads((offload / "index.json").read_text())) == 6  # 3 layers x (weight, bias)


def test_disk_offload_writes_one_file(tmp_path) -> None:
    model = _model()
    x = torch.randn(2, 6)
    expected = model(x)
    disk_offload(model, tmp_path / "off")
    assert torch.allclose(model(x), expected)
    assert sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "off").iterdir()) == ["index.json", "offload"]


def test_get_module_size_with_ties_adds_the_tied_modules_as_a_planner_does() -> None:
    from accel_bigmodel.modeling import get_module_size_with_ties
    from accel_bigmodel.sizes import compute_module_sizes

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.body = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=True)
            self.head.weight = self.embed.weight

    model = Tied()
    sizes = compute_module_sizes(model)
    queue = list(model.named_children())[1:]  # embed is being placed; body and head wait
    total, names, modules = get_module_size_with_ties(["head.weight"], sizes["embed"], sizes, queue)
    assert names == ["head"] and modules == [model.head]
    # the tied weight is counted once (under embed.weight): embed (40 floats) + head's own bias (10)
    assert "head.weight" not in sizes
    assert total == sizes["embed"] + sizes["head"] == (40 + 10) * 4
    sizes_with_both = {**sizes, "head.weight": 160, "head": 200}  # a planner that counts both names
    total, _, _ = get_module_size_with_ties(["head.weight"], 160, sizes_with_both, queue)
    assert total == 160 + 200 - 160
    assert get_module_size_with_ties([], 123, sizes, queue) == (123, [], [])
    with pytest.raises(ValueError, match="'nowhere.weight' belongs to none"):
        get_module_size_with_ties(["nowhere.weight"], 1, sizes, queue)

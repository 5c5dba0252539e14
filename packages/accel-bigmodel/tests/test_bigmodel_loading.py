"""Loading checkpoints into empty models: real safetensors and .bin files, sharded and not."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from bigmodel_models import Net, make_net
from safetensors.torch import save_file

from accel_bigmodel.big_modeling import load_checkpoint_and_dispatch
from accel_bigmodel.checkpoint import load_state_dict
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.loading import CheckpointMismatchError, load_checkpoint_in_model
from accel_bigmodel.sharding import save_sharded
from accel_bigmodel.tensor_io import CheckpointError


def empty_net(**kwargs: object) -> Net:
    with init_empty_weights():
        return Net(**kwargs)  # type: ignore[arg-type]


def assert_same(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    ref = reference.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, ref[name]), name


@pytest.mark.parametrize("layout", ["single", "sharded", "bin", "bin-sharded"])
def test_load_layouts(tmp_path: Path, layout: str) -> None:
    reference = make_net()
    safe = not layout.startswith("bin")
    size = 3000 if layout.endswith("sharded") else "1GB"
    save_sharded(reference.state_dict(), tmp_path, max_shard_size=size, safe_serialization=safe)
    model = empty_net()
    load_checkpoint_in_model(model, tmp_path, strict=True)
    assert_same(model, reference)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_load_plain_index_mapping_and_single_file_path(tmp_path: Path) -> None:
    reference = make_net()
    sd = reference.state_dict()
    keys = list(sd)
    torch.save({k: sd[k] for k in keys[:3]}, tmp_path / "first_state_dict.bin")
    torch.save({k: sd[k] for k in keys[3:]}, tmp_path / "second_state_dict.bin")
    index = {k: ("first_state_dict.bin" if i < 3 else "second_state_dict.bin") for i, k in enumerate(keys)}
    (tmp_path / "index.json").write_text(json.dumps(index))
    model = empty_net()
    load_checkpoint_in_model(model, tmp_path / "index.json")
    assert_same(model, reference)
    save_file(sd, tmp_path / "weights.safetensors")
    model = empty_net()
    load_checkpoint_in_model(model, tmp_path / "weights.safetensors")
    assert_same(model, reference)


def test_dtype_and_keep_in_fp32(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path)
    model = empty_net()
    load_checkpoint_in_model(model, tmp_path, dtype=torch.float16, keep_in_fp32_modules=["head"])
    assert model.embed.weight.dtype == torch.float16
    assert model.head.weight.dtype == torch.float32


def test_strict_mismatch_names_keys_before_loading(tmp_path: Path) -> None:
    sd = make_net().state_dict()
    sd.pop("blocks.1.a.bias")
    sd["extra.weight"] = torch.zeros(3)
    sd["blocks.0.a.weight"] = torch.zeros(3, 3)
    save_file(sd, tmp_path / "model.safetensors")
    model = empty_net()
    with pytest.raises(CheckpointMismatchError) as info:
        load_checkpoint_in_model(model, tmp_path, strict=True)
    message = str(info.value)
    assert "blocks.1.a.bias" in message and "extra.weight" in message and "blocks.0.a.weight" in message
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing moved

    model = empty_net()
    with pytest.warns(UserWarning, match="blocks.1.a.bias"):
        load_checkpoint_in_model(model, tmp_path)
    assert model.blocks[1].a.bias.device.type == "meta"
    assert model.blocks[0].a.weight.device.type == "meta"  # wrong shape: skipped
    assert model.blocks[0].b.weight.device.type == "cpu"


def test_tied_alias_missing_from_checkpoint_is_fine(tmp_path: Path) -> None:
    reference = make_net(tie=True)
    save_sharded(reference.state_dict(), tmp_path)
    model = empty_net(tie=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint_in_model(model, tmp_path, strict=True)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.head.weight, reference.embed.weight)


def test_truncated_shard_is_named(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path, max_shard_size=3000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=shard.name):
        load_checkpoint_in_model(empty_net(), tmp_path)


def test_corrupt_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint_in_model(empty_net(), bad)
    other = tmp_path / "b"
    other.mkdir()
    torch.save(make_net().state_dict(), other / "pytorch_model.bin")
    data = (other / "pytorch_model.bin").read_bytes()
    (other / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        load_checkpoint_in_model(empty_net(), other)


class Payload:
    """Not a tensor: weights_only loading must refuse it."""


def test_bin_with_arbitrary_objects_is_refused(tmp_path: Path) -> None:
    torch.save({"embed.weight": torch.zeros(32, 16), "payload": Payload()}, tmp_path / "pytorch_model.bin")
    from accel_state.errors import UnsafeCheckpointError

    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin"):
        load_checkpoint_in_model(empty_net(), tmp_path)


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path, max_shard_size=3000)
    last = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    os.remove(last)
    with pytest.raises(CheckpointError, match=last.name):
        load_checkpoint_in_model(empty_net(), tmp_path)


def test_folder_without_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("nothing")
    with pytest.raises(ValueError, match="readme.txt"):
        load_checkpoint_in_model(empty_net(), tmp_path)
    with pytest.raises(FileNotFoundError, match="nope"):
        load_checkpoint_in_model(empty_net(), tmp_path / "nope")


def test_disk_offload_reads_safetensors_in_place(tmp_path: Path) -> None:
    reference = make_net().eval()
    ckpt = tmp_path / "ckpt"
    save_sharded(reference.state_dict(), ckpt, max_shard_size=3000)
    offload = tmp_path / "offload"
    device_map = {
        "embed": "cpu",
        "blocks.0": "cpu",
        "blocks.1": "disk",
        "blocks.2": "disk",
        "blocks.3": "disk",
        "head": "disk",
        "scale": "cpu",
    }
    model = load_checkpoint_and_dispatch(empty_net(), ckpt, device_map=device_map, offload_folder=offload)
    # no copy of any weight: the index names links (inside the folder) to the checkpoint's own shards
    index = json.loads((offload / "index.json").read_text())
    shards = [ckpt / n for n in os.listdir(ckpt) if n.endswith(".safetensors")]
    for name in set(os.listdir(offload)) - {"index.json"}:
        assert any(os.path.samefile(offload / name, shard) for shard in shards)
    named = {entry["safetensors_file"] for entry in index.values()}
    assert named <= set(os.listdir(offload)) and all(not os.path.isabs(n) for n in named)
    assert index["head.weight"]["safetensors_file"].endswith(".safetensors")
    assert model.hf_device_map == device_map
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))


def test_disk_offload_from_bin_writes_offload_files(tmp_path: Path) -> None:
    reference = make_net().eval()
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    model = load_checkpoint_and_dispatch(
        empty_net(),
        tmp_path,
        device_map={"embed": "cpu", "blocks": "cpu", "head": "disk", "scale": "cpu"},
        offload_folder=tmp_path / "off",
    )
    assert list((tmp_path / "off").glob("*.dat")) == []  # one safetensors file, not one .dat per tensor
    assert len(list((tmp_path / "off").glob("offload-*.safetensors"))) == 1
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))


def test_auto_device_map_with_small_budget_and_offload_state_dict(tmp_path: Path) -> None:
    reference = make_net().eval()
    save_sharded(reference.state_dict(), tmp_path / "ckpt", max_shard_size=3000)
    model = load_checkpoint_and_dispatch(
        empty_net(),
        tmp_path / "ckpt",
        device_map="auto",
        max_memory={"cpu": "8KB"},
        no_split_module_classes=["Block"],
        offload_folder=tmp_path / "off",
    )
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    ids = torch.randint(0, 32, (3, 4))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))


def test_disk_map_without_offload_folder_is_an_error(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path)
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_in_model(empty_net(), tmp_path, device_map={"": "disk"})


def test_device_map_strategy_typo(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path)
    with pytest.raises(ValueError, match="balanced_low0"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path, device_map="balanced_low0")


def test_invented_module_in_device_map(tmp_path: Path) -> None:
    save_sharded(make_net().state_dict(), tmp_path)
    with pytest.raises(ValueError, match="decoder"):
        load_checkpoint_in_model(empty_net(), tmp_path, device_map={"": "cpu", "decoder": "cpu"})


def test_load_state_dict_files(tmp_path: Path) -> None:
    sd = make_net().state_dict()
    save_file(sd, tmp_path / "a.safetensors")
    torch.save(sd, tmp_path / "a.bin")
    for name in ("a.safetensors", "a.bin"):
        loaded = load_state_dict(tmp_path / name)
        assert all(torch.equal(loaded[k], v) for k, v in sd.items())


def test_flax_safetensors_refused(tmp_path: Path) -> None:
    save_file({"x": torch.zeros(2)}, tmp_path / "model.safetensors", metadata={"format": "flax"})
    with pytest.raises(CheckpointError, match="flax"):
        load_state_dict(tmp_path / "model.safetensors")

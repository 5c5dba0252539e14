"""Loading stays inside the checkpoint, and a folder never mixes two saves (issue 36, point 6).

* A symbolic link in a sharded-weights folder or an offload folder whose target resolves outside it is
  refused with `UnsafeCheckpointError` naming the link and its target; a link that stays inside, and the
  Hugging Face hub cache layout (``snapshots/<rev>/`` links into ``../../blobs/``), still load.
* What accel writes into an offload folder (weights of a checkpoint stored elsewhere) reads back.
* A ``.bin`` shard copied from another save of the same size is refused (the index records each
  ``torch.save`` shard's identity).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from bigmodel_models import state_values
from kill_sharded_save import net
from safetensors.torch import load_file
from torch import nn

from accel_bigmodel import OffloadedWeightsLoader, load_checkpoint_and_dispatch, load_checkpoint_in_model
from accel_bigmodel.offload import offload_weight, save_offload_index
from accel_bigmodel.sharding import save_sharded
from accel_bigmodel.tensor_io import CheckpointError
from accel_state.errors import UnsafeCheckpointError


def _same(model: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(state) and all(torch.equal(now[k], state[k]) for k in state)


def _sharded(folder: Path, seed: int = 1, safe: bool = True) -> list[Path]:
    save_sharded(net(seed).state_dict(), folder, max_shard_size=3000, safe_serialization=safe)
    shards = sorted(folder.glob("model-*.safetensors" if safe else "pytorch_model-*.bin"))
    assert len(shards) > 1
    return shards


def _link_out(shard: Path, outside: Path) -> None:
    """Move ``shard`` out of its folder to ``outside`` and leave a symbolic link to it in its place."""
    shutil.move(shard, outside)
    shard.symlink_to(outside)


@pytest.mark.parametrize("loader", ["in_model", "and_dispatch"])
def test_shard_linked_outside_the_folder_is_refused(tmp_path: Path, loader: str) -> None:
    folder = tmp_path / "ckpt"
    shard = _sharded(folder)[0]
    outside = tmp_path / "elsewhere" / shard.name
    outside.parent.mkdir()
    _link_out(shard, outside)
    model = net(0)
    before = state_values(model)
    with pytest.raises(UnsafeCheckpointError) as info:
        if loader == "in_model":
            load_checkpoint_in_model(model, folder)
        else:
            load_checkpoint_and_dispatch(model, str(folder))
    assert info.value.path == str(folder / "model.safetensors.index.json")
    assert f"{str(shard)!r} -> {str(outside)!r}" in info.value.found
    assert _same(model, before)


def test_shard_linked_inside_the_folder_loads(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    shard = _sharded(folder)[0]
    (folder / "store").mkdir()
    _link_out(shard, folder / "store" / shard.name)
    model = net(0)
    load_checkpoint_in_model(model, folder)
    assert _same(model, net(1).state_dict())


def test_single_weights_file_linked_outside_a_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    secret = tmp_path / "secret.safetensors"
    save_sharded(net(1).state_dict(), tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", secret)
    (folder / "model.safetensors").symlink_to(secret)
    with pytest.raises(UnsafeCheckpointError, match="resolves to .* outside the folder"):
        load_checkpoint_in_model(net(0), folder)


def _hub_cache(root: Path, seed: int) -> Path:
    """A hub cache repository folder holding a sharded save: the files in ``blobs/``, the snapshot's names
    links to them as ``../../blobs/<name>``. Returns the snapshot folder."""
    staging = root / "staging"
    save_sharded(net(seed).state_dict(), staging, max_shard_size=3000)
    repo = root / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, file in enumerate(sorted(staging.iterdir())):
        blob = f"blob{number:04d}"
        shutil.move(file, blobs / blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    return snapshot


def test_hub_cache_layout_loads(tmp_path: Path) -> None:
    snapshot = _hub_cache(tmp_path, seed=3)
    model = net(0)
    load_checkpoint_in_model(model, snapshot)
    assert _same(model, net(3).state_dict())


def test_hub_cache_link_leaving_the_repository_is_refused(tmp_path: Path) -> None:
    snapshot = _hub_cache(tmp_path, seed=3)
    shard = sorted(snapshot.glob("model-*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.copy(shard, outside)
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(UnsafeCheckpointError, match="outside the folder"):
        load_checkpoint_in_model(net(0), snapshot)


def _offload_folder(folder: Path) -> dict[str, torch.Tensor]:
    weights = {"a": torch.arange(4.0), "b": torch.ones(2, 2)}
    index: dict = {}
    for name, tensor in weights.items():
        index.update(offload_weight(tensor, name, folder, index))
    save_offload_index(index, folder)
    return weights


def test_offloaded_dat_linked_outside_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    _offload_folder(folder)
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x07" * 16)  # the size of "a": 4 float32
    (folder / "a.dat").unlink()
    (folder / "a.dat").symlink_to(secret)
    with pytest.raises(UnsafeCheckpointError) as info:
        OffloadedWeightsLoader(save_folder=folder)
    assert info.value.path == str(folder / "index.json")
    assert f"{str(folder / 'a.dat')!r} -> {str(secret)!r}" in info.value.found


def test_offloaded_safetensors_linked_outside_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "offload"
    folder.mkdir()
    outside = tmp_path / "outside.safetensors"
    save_file({"w": torch.ones(3)}, str(outside))
    (folder / "w.safetensors").symlink_to(outside)
    (folder / "index.json").write_text(json.dumps({"w": {"safetensors_file": "w.safetensors", "weight_name": "w"}}))
    with pytest.raises(UnsafeCheckpointError, match="w.safetensors"):
        OffloadedWeightsLoader(save_folder=folder)


def test_offloaded_dat_linked_inside_loads(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    weights = _offload_folder(folder)
    (folder / "kept").mkdir()
    shutil.move(folder / "a.dat", folder / "kept" / "a.dat")
    (folder / "a.dat").symlink_to(Path("kept") / "a.dat")
    assert torch.equal(OffloadedWeightsLoader(save_folder=folder)["a"], weights["a"])


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard-link", "no-hard-links"])
def test_what_accel_offloads_from_another_folder_reads_back(tmp_path: Path, monkeypatch, hard_links: bool) -> None:
    """Weights of a checkpoint kept elsewhere are linked into the offload folder; where hard links fail
    (another filesystem) they are copied, never symbolically linked out of the folder."""
    checkpoint, offload = tmp_path / "ckpt", tmp_path / "offload"
    save_sharded(net(4).state_dict(), checkpoint)
    if not hard_links:

        def no_link(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "link", no_link)
    load_checkpoint_in_model(net(0), checkpoint, device_map={"": "disk"}, offload_folder=offload)
    monkeypatch.undo()
    assert not any(path.is_symlink() for path in offload.iterdir())
    loader = OffloadedWeightsLoader(save_folder=offload)
    expected = load_file(checkpoint / "model.safetensors")
    assert set(loader) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loader[name], tensor)


def test_bin_shard_from_another_save_of_the_same_size_is_refused(tmp_path: Path) -> None:
    folder, other = tmp_path / "ckpt", tmp_path / "other"
    shard = _sharded(folder, seed=1, safe=False)[0]
    _sharded(other, seed=2, safe=False)
    assert os.path.getsize(other / shard.name) == os.path.getsize(shard)
    index = json.loads((folder / "pytorch_model.bin.index.json").read_text())
    assert set(index["metadata"]["accel_file_ids"]) == set(index["weight_map"].values())
    shutil.copy(other / shard.name, shard)  # same name, size and shapes: another save's values
    model = net(0)
    before = state_values(model)
    with pytest.raises(CheckpointError, match="mixes two saves") as info:
        load_checkpoint_in_model(model, folder)
    assert shard.name in str(info.value)
    assert _same(model, before)


def test_bin_shards_of_one_save_load(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _sharded(folder, seed=5, safe=False)
    model = net(0)
    load_checkpoint_in_model(model, folder)
    assert _same(model, net(5).state_dict())


def test_folder_given_through_a_link_loads(tmp_path: Path) -> None:
    """The folder itself may be a link (a checkpoint kept on another disk): its files resolve inside its target."""
    real = tmp_path / "disk" / "ckpt"
    _sharded(real, seed=6)
    (tmp_path / "ckpt").symlink_to(real)
    model = net(0)
    load_checkpoint_in_model(model, tmp_path / "ckpt")
    assert _same(model, net(6).state_dict())


def test_allowed_root_widens_only_for_a_hub_cache_snapshot(tmp_path: Path) -> None:
    from accel_bigmodel.confine import allowed_root

    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "rev"
    (snapshot / "sub").mkdir(parents=True)
    assert allowed_root(str(snapshot)) == str(snapshot.resolve())  # no blobs/ beside snapshots/: not a cache
    (repo / "blobs").mkdir()
    assert allowed_root(str(snapshot)) == str(repo.resolve())
    assert allowed_root(str(snapshot / "sub")) == str(repo.resolve())
    assert allowed_root(str(repo / "blobs")) == str((repo / "blobs").resolve())

"""``accel merge-weights`` refuses what it cannot merge whole, before it writes or deletes anything (issue 36).

Each case builds its crafted folder itself: an output folder inside the checkpoint that
``--remove_checkpoint_dir`` deletes, a DeepSpeed folder with a planted empty DCP ``.metadata``, and a
``.metadata`` declaring a tensor of 2**62 elements.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

from accel_train.commands import merge as merge_command


def _dcp_folder(folder: str) -> dict[str, torch.Tensor]:
    state = {"w": torch.arange(4.0), "b": torch.ones(2, 3)}
    dcp.save({"model": state}, checkpoint_id=folder, no_dist=True)
    return state


def _engine_folder(folder: str) -> None:
    """A DeepSpeed engine folder as ZeRO-0 writes it: ``mp_rank_00_model_states.pt`` holding the module."""
    os.makedirs(folder)
    torch.save({"module": {"w": torch.arange(4.0)}}, os.path.join(folder, "mp_rank_00_model_states.pt"))


def _plant_empty_metadata(folder: str, storage_data: dict | None = None) -> None:
    with open(os.path.join(folder, ".metadata"), "wb") as handle:
        pickle.dump(Metadata(state_dict_metadata={}, storage_data=storage_data), handle)


def test_output_inside_the_removed_folder_is_refused_up_front(tmp_path, capsys) -> None:
    folder = str(tmp_path / "pytorch_model_fsdp_0")
    _dcp_folder(folder)
    before = sorted(os.listdir(folder))
    for output in (os.path.join(folder, "merged"), folder):
        code = merge_command.main([folder, output, "--remove_checkpoint_dir"])
        err = capsys.readouterr()
        assert code == 2 and "written" not in err.out
        assert f"output_path {output} lies inside the checkpoint folder {folder}" in err.err
        assert sorted(os.listdir(folder)) == before, "the checkpoint was touched"
    assert not os.path.exists(os.path.join(folder, "merged"))


def test_output_beside_the_removed_folder_is_merged_and_the_folder_removed(tmp_path) -> None:
    """A save_state folder: only its pytorch_model_fsdp_0/ is removed, so an output beside it survives."""
    state = _dcp_folder(str(tmp_path / "pytorch_model_fsdp_0"))
    output = tmp_path / "merged"
    assert merge_command.main([str(tmp_path), str(output), "--remove_checkpoint_dir"]) == 0
    from safetensors.torch import load_file

    assert torch.equal(load_file(output / "model.safetensors")["w"], state["w"])
    assert not (tmp_path / "pytorch_model_fsdp_0").exists()


@pytest.mark.parametrize("given", ["engine", "save_state"])
def test_deepspeed_folder_with_planted_empty_metadata_is_refused(tmp_path, capsys, given: str) -> None:
    engine = str(tmp_path / "pytorch_model")
    _engine_folder(engine)
    _plant_empty_metadata(engine)
    code = merge_command.main([engine if given == "engine" else str(tmp_path), str(tmp_path / "out")])
    err = capsys.readouterr()
    assert code == 2 and "written" not in err.out
    assert os.path.join(engine, ".metadata") in err.err and "DeepSpeed engine folder" in err.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", ["sharded", "save_state"])
def test_sharded_folder_naming_no_tensor_is_refused(tmp_path, capsys, given: str) -> None:
    """An empty ``.metadata`` planted as ``pytorch_model_fsdp_0/.metadata`` names no tensor: merging it wrote an
    empty model.safetensors and reported success."""
    folder = tmp_path / "pytorch_model_fsdp_0"
    os.makedirs(folder)
    given_folder = str(folder if given == "sharded" else tmp_path)
    _plant_empty_metadata(str(folder), storage_data={})
    code = merge_command.main([given_folder, str(tmp_path / "out")])
    err = capsys.readouterr()
    assert code == 2 and "written" not in err.out
    assert f"{folder} holds no tensor" in err.err
    assert not (tmp_path / "out").exists()
    _plant_empty_metadata(str(folder))  # no storage records at all: torch's reader would assert
    code = merge_command.main([given_folder, str(tmp_path / "out")])
    err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err.err
    assert f"{folder / '.metadata'}" in err.err and "storage records" in err.err
    assert not (tmp_path / "out").exists()


def _declare(folder: str, name: str, size: int, chunk_size: int) -> None:
    """Rewrite the ``.metadata`` of ``folder`` so that tensor ``name`` (1-D) is declared ``size`` elements
    long, its one chunk ``chunk_size``."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as handle:
        metadata = pickle.load(handle)  # written by this test just before
    entry = metadata.state_dict_metadata[name]
    entry.size = torch.Size([size])
    entry.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([chunk_size]))]
    with open(path, "wb") as handle:
        pickle.dump(metadata, handle)


@pytest.mark.parametrize("chunk", ["whole", "small"])
def test_huge_declared_tensor_is_refused_before_allocating(tmp_path, capsys, chunk: str) -> None:
    from accel_state.errors import CorruptCheckpointError
    from accel_train.checkpoint.safety import read_dcp_metadata

    folder = str(tmp_path / "pytorch_model_fsdp_0")
    _dcp_folder(folder)
    huge = 2**62
    _declare(folder, "model.w", huge, huge if chunk == "whole" else 4)
    code = merge_command.main([folder, str(tmp_path / "out")])
    err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err.err
    assert f"tensor 'model.w' of size ({huge},)" in err.err
    with pytest.raises(CorruptCheckpointError) as info:
        read_dcp_metadata(os.path.join(folder, ".metadata"))
    assert info.value.path == os.path.join(folder, ".metadata")
    assert not (tmp_path / "out").exists()


def test_chunk_outside_its_tensor_is_refused(tmp_path, capsys) -> None:
    folder = str(tmp_path / "pytorch_model_fsdp_0")
    _dcp_folder(folder)
    _declare(folder, "model.w", 4, 5)
    assert merge_command.main([folder, str(tmp_path / "out")]) == 2
    assert "chunks of tensor 'model.w' inside its size (4,)" in capsys.readouterr().err


def test_data_file_linked_outside_the_folder_is_refused(tmp_path, capsys) -> None:
    from accel_state.errors import UnsafeCheckpointError
    from accel_train.checkpoint.merge import merge_fsdp_weights

    folder = tmp_path / "pytorch_model_fsdp_0"
    _dcp_folder(str(folder))
    data = next(folder.glob("*.distcp"))
    outside = tmp_path / "elsewhere" / data.name
    outside.parent.mkdir()
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(UnsafeCheckpointError) as info:
        merge_fsdp_weights(str(folder), str(tmp_path / "out"))
    assert info.value.path == str(data) and str(outside) in info.value.found
    assert merge_command.main([str(folder), str(tmp_path / "out")]) == 2
    assert "outside the folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

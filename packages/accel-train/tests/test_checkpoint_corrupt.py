"""Damaged checkpoints (issue 37): a file of a real ``save_state`` cut short or garbled, not crafted.

Each case damages one file of a checkpoint written by ``save_state`` on one process, trains on so that
the live values differ from the saved ones, and checks that ``load_state`` raises
``CorruptCheckpointError`` naming the file, what was expected and what was found, before anything is
loaded: the model's parameters and the optimizer's state are unchanged. A well-formed pickle that asks
for ``os.system`` stays an ``UnsafeCheckpointError`` and runs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import pickle

import pytest
import torch

from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError
from accel_state.testing import pickle_record_span, reset_shared_state


class Exploit:
    """Unpickling this calls ``os.system`` (a real exploit shape): it would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _snapshot(model, optimizer) -> tuple[dict, dict]:
    params = {name: value.detach().clone() for name, value in model.state_dict().items()}
    state = {
        index: {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in entry.items()}
        for index, entry in enumerate(optimizer.optimizer.state.values())
    }
    return params, state


def _assert_unchanged(before: tuple[dict, dict], after: tuple[dict, dict]) -> None:
    assert before[0].keys() == after[0].keys()
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), f"parameter {name} changed"
    assert before[1].keys() == after[1].keys()
    for index, entry in before[1].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(after[1][index][key]), torch.as_tensor(value)), f"optimizer {key}"


def _truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(keep)


def _garble(path: str, start: int, count: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(start)
        data = bytes(byte ^ 0x5A for byte in handle.read(count))
        handle.seek(start)
        handle.write(data)


def _safetensors_header_end(path: str) -> int:
    with open(path, "rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


def _damage(folder: str, kind: str) -> str:
    """Damage one file of ``folder`` as ``kind`` says; returns its path."""
    if kind.startswith("model"):
        path = os.path.join(folder, "model.safetensors")
    elif kind.startswith("rng"):
        path = os.path.join(folder, "random_states_0.safetensors")
    elif kind.startswith("optimizer"):
        path = os.path.join(folder, "optimizer.bin")
    else:
        path = os.path.join(folder, "accel_checkpoint.json")
    size = os.path.getsize(path)
    if kind in ("model_half", "rng_half", "optimizer_half"):
        _truncate(path, size // 2)
    elif kind in ("model_data_short", "rng_data_short"):  # the header whole, the tensors cut short
        _truncate(path, (_safetensors_header_end(path) + size) // 2)
    elif kind == "optimizer_pickle_garbled":  # 100 bytes inside the pickle record
        start, length = pickle_record_span(path)
        _garble(path, start + max(0, length // 2 - 50), 100)
    elif kind == "manifest_not_json":
        with open(path, "r+b") as handle:
            handle.write(b"{garbled")
    elif kind == "manifest_wrong_structure":
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"format_version": 1, "num_processes": "two", "step": 1}, handle)
    else:
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "model_half",
        "model_data_short",
        "rng_half",
        "rng_data_short",
        "optimizer_half",
        "optimizer_pickle_garbled",
        "manifest_not_json",
        "manifest_wrong_structure",
    ],
)
def test_damaged_file_is_named_and_nothing_is_loaded(saved, kind: str) -> None:
    accelerator, model, optimizer, folder = saved
    path = _damage(folder, kind)
    before = _snapshot(model, optimizer)
    rng_before = torch.get_rng_state()
    with pytest.raises(CorruptCheckpointError) as info:
        accelerator.load_state(folder)
    error = info.value
    assert not isinstance(error, UnsafeCheckpointError) and isinstance(error, ValueError)
    assert error.path == path and repr(path) in str(error)
    assert "expected" in str(error) and "found" in str(error) and "earlier checkpoint" in str(error)
    _assert_unchanged(before, _snapshot(model, optimizer))
    assert torch.equal(torch.get_rng_state(), rng_before)
    if kind == "optimizer_pickle_garbled":
        assert "CRC-32" in error.expected and "data.pkl" in error.expected


def test_garbled_pickle_without_crc_is_corrupt(saved) -> None:
    """A file written without CRC-32 (torch's option) whose pickle holds a byte that is no opcode: torch's
    reader says "Unsupported operand 120", yet it is damage, not an attack."""
    accelerator, model, optimizer, folder = saved
    path = os.path.join(folder, "optimizer.bin")
    state = torch.load(path, weights_only=True)
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(True)
    start, _ = pickle_record_span(path)
    with open(path, "r+b") as handle:
        handle.seek(start + 2)  # right after PROTO
        handle.write(b"x")  # opcode 120 does not exist
    before = _snapshot(model, optimizer)
    with pytest.raises(CorruptCheckpointError, match="optimizer.bin") as info:
        accelerator.load_state(folder)
    assert "pickle" in info.value.found
    _assert_unchanged(before, _snapshot(model, optimizer))


def test_a_sound_file_of_another_size_than_recorded_loads_with_a_warning_naming_it(saved, caplog) -> None:
    """Random states written by another run (one more generator) in this one's place: a well-formed file
    that every check passes, but not the one the manifest recorded. It loads, as the documented system
    loads it, and a warning names it with both sizes."""
    from accel_train.checkpoint.file_io import save_rng

    accelerator, _model, _optimizer, folder = saved
    path = os.path.join(folder, "random_states_0.safetensors")
    recorded = os.path.getsize(path)
    torch.manual_seed(1234)
    save_rng(path, extra_generators={"sampler": torch.Generator()})
    planted = torch.get_rng_state()
    found = os.path.getsize(path)
    assert found > recorded
    torch.manual_seed(99)
    with caplog.at_level(logging.WARNING, logger="accel_train.checkpoint.checks"):
        accelerator.load_state(folder)
    assert torch.equal(torch.get_rng_state(), planted)  # the file as it is now was loaded
    warnings = [r.getMessage() for r in caplog.records if "changed after the save" in r.getMessage()]
    assert warnings == [
        f"checkpoint file {path!r} holds {found} bytes, but the save recorded {recorded}: it changed after "
        "the save (loaded as it is now)"
    ]


def test_a_file_added_after_the_save_does_not_stop_a_load(saved) -> None:
    accelerator, _model, _optimizer, folder = saved
    with open(os.path.join(folder, "notes.txt"), "w", encoding="utf-8") as handle:
        handle.write("the user's own file")
    accelerator.load_state(folder)


def test_planted_pickle_stays_unsafe(saved, tmp_path) -> None:
    accelerator, model, optimizer, folder = saved
    marker = str(tmp_path / "marker")
    path = os.path.join(folder, "optimizer.bin")
    state = torch.load(path, weights_only=True)
    state["param_groups"][0]["planted"] = Exploit(marker)
    torch.save(state, path)
    before = _snapshot(model, optimizer)
    with pytest.raises(UnsafeCheckpointError) as info:
        accelerator.load_state(folder)
    assert not isinstance(info.value, CorruptCheckpointError)
    assert info.value.path == path and "system" in info.value.found
    assert not os.path.exists(marker)
    _assert_unchanged(before, _snapshot(model, optimizer))


def test_raw_pickle_planted_as_a_torch_file_stays_unsafe(saved, tmp_path) -> None:
    """A plain pickle (no zip) in the optimizer's place: well formed, so refused, not called damaged."""
    accelerator, model, optimizer, folder = saved
    marker = str(tmp_path / "marker")
    path = os.path.join(folder, "optimizer.bin")
    with open(path, "wb") as handle:
        pickle.dump({"state": {}, "param_groups": [Exploit(marker)]}, handle, protocol=2)
    before = _snapshot(model, optimizer)
    with pytest.raises(UnsafeCheckpointError):
        accelerator.load_state(folder)
    assert not os.path.exists(marker)
    _assert_unchanged(before, _snapshot(model, optimizer))


def test_module_level_readers_name_damaged_files(tmp_path) -> None:
    """The single-file readers used outside ``load_state`` (``load_weights``, ``load_torch``, ``load_rng``,
    ``read_manifest``) say the same."""
    from accel_train.checkpoint.file_io import (
        MANIFEST_NAME,
        load_rng,
        load_torch,
        load_weights,
        read_manifest,
        save_rng,
        save_weights,
        write_manifest,
    )

    weights, blob, rng = (str(tmp_path / name) for name in ("w.safetensors", "o.bin", "r.safetensors"))
    save_weights({"w": torch.ones(64)}, weights)
    torch.save({"x": torch.ones(64)}, blob)
    save_rng(rng)
    write_manifest(str(tmp_path), {"num_processes": 1})
    for path in (weights, blob, rng):
        _truncate(path, os.path.getsize(path) - 3)
    with open(os.path.join(tmp_path, MANIFEST_NAME), "w", encoding="utf-8") as handle:
        handle.write("[1, 2")
    for read, path in ((load_weights, weights), (load_torch, blob), (load_rng, rng)):
        with pytest.raises(CorruptCheckpointError, match=os.path.basename(path)):
            read(path)
    with pytest.raises(CorruptCheckpointError, match=MANIFEST_NAME):
        read_manifest(str(tmp_path))


def test_error_survives_pickling_between_processes() -> None:
    error = CorruptCheckpointError("/ckpt/optimizer.bin", "a zip", "a file of 3 bytes")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CorruptCheckpointError and str(copy) == str(error) and copy.path == error.path


@pytest.mark.parametrize("damage", ["metadata_cut", "item_cut", "item_pickle_garbled"])
def test_damaged_sharded_folder_is_named_and_nothing_is_loaded(tmp_path, damage: str) -> None:
    """FSDP2's sharded state (``torch.distributed.checkpoint`` folders) on one process: a ``.metadata`` cut
    short, a ``.distcp`` file cut short, or an item's pickle garbled is damage, found before loading."""
    from fsdp_helpers import BlockNet, regression_batches

    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    reset_shared_state()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = regression_batches(2, 8, seed=0)
    for x, y in batches:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if not os.path.isdir(tmp_path / "ckpt"):
            accelerator.save_state(str(tmp_path / "ckpt"))
    folder = str(tmp_path / "ckpt" / "optimizer_0")
    if damage == "metadata_cut":
        path = os.path.join(folder, ".metadata")
        _truncate(path, os.path.getsize(path) // 2)
    else:
        path = os.path.join(folder, "__0_0.distcp")
        if damage == "item_cut":
            _truncate(path, os.path.getsize(path) - 10)
        else:  # the first item is a torch.save zip at byte 0, its pickle the first record
            with open(path, "rb") as handle:
                header = handle.read(30)
            name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
            _garble(path, 30 + name_len + extra_len + 10, 40)
    params = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    with pytest.raises(CorruptCheckpointError) as info:
        accelerator.load_state(str(tmp_path / "ckpt"))
    assert info.value.path == path, str(info.value)
    after = accelerator.get_state_dict(model)
    assert all(torch.equal(after[name], value) for name, value in params.items())
    reset_shared_state()

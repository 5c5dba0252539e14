"""Checkpoint safety of accel-bigmodel with real files and real processes.

* Nothing runs on load: a crafted pickle whose ``__reduce__`` would write a marker file is refused
  with ``UnsafeCheckpointError`` naming the file and what was found; the marker never appears and the
  model keeps its values.
* Sharded saves are atomic: a fresh process saving over an earlier save is SIGKILLed at its writes,
  renames, links and removals (every commit step and a spread of the rest; all of them with
  ``ACCEL_KILL_POINTS=all``); the folder then loads as exactly the old or the new state.
* A reader refuses an index naming missing files, files of another size or of another save, and
  entries (sharded or offload index) that point outside their folder.
* A full disk (``RLIMIT_FSIZE``) or a read-only folder gives an error naming the path and the OS
  reason, leaves no partial file, and the previous save still loads.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import kill_sharded_save  # the SIGKILL test's child script, beside this file
import pytest
import torch
from bigmodel_models import Payload, state_values
from torch import nn

from accel_bigmodel import OffloadedWeightsLoader, load_checkpoint_in_model
from accel_bigmodel.offload import offload_state_dict, offload_weight
from accel_bigmodel.safe_write import TMP_PREFIX, CheckpointWriteError
from accel_bigmodel.sharding import save_sharded
from accel_bigmodel.tensor_io import CheckpointError
from accel_state.errors import UnsafeCheckpointError
from accel_state.kill_points import choose_kill_points, run_kill_points


def _net(seed: int = 0) -> nn.Module:
    return kill_sharded_save.net(seed)


def _same(model: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(state) and all(torch.equal(now[k], state[k]) for k in state)


# -- nothing runs on load --------------------------------------------------------------------------
@pytest.mark.parametrize("zipped", [True, False], ids=["torch.save", "raw-pickle"])
def test_crafted_bin_is_refused_and_runs_nothing(tmp_path: Path, zipped: bool) -> None:
    marker = tmp_path / "marker"
    payload = {**_net(1).state_dict(), "extra": Payload(str(marker))}
    path = tmp_path / "ckpt" / "pytorch_model.bin"
    path.parent.mkdir()
    if zipped:
        torch.save(payload, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(payload, f, protocol=2)
    model = _net(0)
    before = state_values(model)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint_in_model(model, path.parent)
    assert info.value.path == str(path) and "pytorch_model.bin" in str(info.value)
    if zipped:
        assert "posix.system" in info.value.found
    assert not marker.exists()
    assert _same(model, before)


def test_crafted_shard_of_a_sharded_bin_checkpoint_leaves_the_model_unchanged(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    folder = tmp_path / "ckpt"
    save_sharded(_net(1).state_dict(), folder, max_shard_size=3000, safe_serialization=False)
    shards = sorted(folder.glob("pytorch_model-*.bin"))
    assert len(shards) > 1
    last = torch.load(shards[-1], weights_only=True)
    torch.save({**last, "extra": Payload(str(marker))}, shards[-1])
    index_path = folder / "pytorch_model.bin.index.json"
    index = json.loads(index_path.read_text())
    del index["metadata"]["accel_file_sizes"]  # a crafted folder, as another tool would write it
    del index["metadata"]["accel_file_ids"]
    index_path.write_text(json.dumps(index))
    model = _net(0)
    before = state_values(model)
    with pytest.raises(UnsafeCheckpointError, match=shards[-1].name):
        load_checkpoint_in_model(model, folder)
    assert not marker.exists() and _same(model, before)


# -- index entries stay in their folder --------------------------------------------------------------
@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.safetensors", "sub/../../outside.safetensors"])
def test_sharded_index_entry_outside_its_folder_is_refused(tmp_path: Path, bad: str) -> None:
    folder = tmp_path / "ckpt"
    save_sharded(_net(1).state_dict(), folder, max_shard_size=3000)
    shutil.copy(next(folder.glob("model-*.safetensors")), tmp_path / "outside.safetensors")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = bad
    index_path.write_text(json.dumps(index))
    with pytest.raises(UnsafeCheckpointError, match="outside the index's folder") as info:
        load_checkpoint_in_model(_net(0), folder)
    assert info.value.path == str(index_path) and bad in info.value.found


@pytest.mark.parametrize("bad", ["absolute", "dotdot"])
def test_offload_index_entry_outside_its_folder_is_refused(tmp_path: Path, bad: str) -> None:
    from safetensors.torch import save_file

    outside = tmp_path / "outside.safetensors"
    save_file({"w": torch.ones(3)}, str(outside))
    folder = tmp_path / "offload"
    folder.mkdir()
    name = str(outside) if bad == "absolute" else "../outside.safetensors"
    (folder / "index.json").write_text(json.dumps({"w": {"safetensors_file": name, "weight_name": "w"}}))
    with pytest.raises(UnsafeCheckpointError, match="outside the offload folder"):
        OffloadedWeightsLoader(save_folder=folder)


def test_offload_dat_name_outside_its_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    folder.mkdir()
    (tmp_path / "secret.dat").write_bytes(b"\0" * 12)
    (folder / "index.json").write_text(json.dumps({"../secret": {"dtype": "float32", "shape": [3]}}))
    with pytest.raises(UnsafeCheckpointError, match="outside the offload folder"):
        OffloadedWeightsLoader(save_folder=folder)
    with pytest.raises(ValueError, match="outside the offload folder"):
        offload_weight(torch.ones(3), "../escape", folder)
    assert not (tmp_path / "escape.dat").exists()


def test_offloaded_dat_of_another_size_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    index = offload_weight(torch.ones(4), "w", folder)
    with open(folder / "index.json", "w") as f:
        json.dump(index, f)
    (folder / "w.dat").write_bytes(b"\0" * 8)
    with pytest.raises(CheckpointError, match="records 16"):
        OffloadedWeightsLoader(save_folder=folder)["w"]


# -- the reader checks what the index records ------------------------------------------------------------
def test_shard_of_another_size_or_another_save_is_refused(tmp_path: Path) -> None:
    folder, other = tmp_path / "ckpt", tmp_path / "other"
    save_sharded(_net(1).state_dict(), folder, max_shard_size=3000)
    save_sharded(_net(2).state_dict(), other, max_shard_size=3000)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    shutil.copy(other / shard.name, shard)  # same names and shapes, another save
    with pytest.raises(CheckpointError, match="mixes two saves"):
        load_checkpoint_in_model(_net(0), folder)
    with open(shard, "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(CheckpointError, match="records"):
        load_checkpoint_in_model(_net(0), folder)
    shard.unlink()
    with pytest.raises(CheckpointError, match="do not exist"):
        load_checkpoint_in_model(_net(0), folder)


# -- atomic sharded save under SIGKILL ------------------------------------------------------------------
KILL_CHILD = Path(__file__).resolve().parent / "kill_sharded_save.py"
KILL_PRELOAD = ("torch", "safetensors.torch", "accel_bigmodel.sharding", "accel_state.kill_points")


def _kill_points(tmp_path: Path, old_shard: int, new_shard: int, fmt: str) -> tuple[list[str], dict[int, bool]]:
    """Save seed 2 over a save of seed 1 in fresh processes (kill_sharded_save.py) killed at the chosen file
    events, each over its own folder ``tmp_path/ckpt-K``; returns every event's label and ``{K: killed}``."""

    def command(kill_at: int) -> list[str]:
        folder = tmp_path / f"ckpt-{kill_at}"
        save_sharded(_net(1).state_dict(), folder, max_shard_size=old_shard, safe_serialization=fmt == "safetensors")
        log = str(tmp_path / "events.txt")
        return [sys.executable, str(KILL_CHILD), str(folder), "2", str(new_shard), str(kill_at), fmt, log]

    run_kill_points(command, [0], preload=KILL_PRELOAD)  # the counting run
    labels = (tmp_path / "events.txt").read_text().splitlines()
    return labels, run_kill_points(command, [*choose_kill_points(labels), len(labels) + 1], preload=KILL_PRELOAD)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    model = _net(99)
    load_checkpoint_in_model(model, folder, strict=True)
    return state_values(model)


@pytest.mark.parametrize(
    "old_shard,new_shard,fmt",
    [
        (3000, 3000, "safetensors"),  # same shard names: the intermediate-index path
        (3000, 2000, "safetensors"),  # more shards: old ones become stale
        (3000, 10**9, "safetensors"),  # sharded -> one file
        (10**9, 3000, "safetensors"),  # one file -> sharded
        (3000, 3000, "bin"),
    ],
)
def test_sigkill_at_every_step_leaves_the_old_or_the_new_save(
    tmp_path: Path, old_shard: int, new_shard: int, fmt: str
) -> None:
    new_state = state_values(_net(2))
    old_state = state_values(_net(1))
    labels, killed = _kill_points(tmp_path, old_shard, new_shard, fmt)
    outcomes = {"old": 0, "new": 0}
    for kill_at, was_killed in sorted(killed.items()):
        folder = tmp_path / f"ckpt-{kill_at}"
        loaded = _load(folder)
        same_as = [name for name, st in (("old", old_state), ("new", new_state)) if _equal(loaded, st)]
        assert same_as, f"killed at event {kill_at} ({labels[kill_at - 1]}): the folder loads as a mix of two saves"
        if not was_killed:
            assert kill_at == len(labels) + 1, f"the save finished before its event {kill_at}"
            assert same_as == ["new"]
            assert not [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]
            continue
        outcomes[same_as[0]] += 1
        # the next save over the interrupted folder completes and cleans up
        save_sharded(_net(3).state_dict(), folder, max_shard_size=new_shard, safe_serialization=fmt == "safetensors")
        assert _equal(_load(folder), state_values(_net(3)))
        assert not [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]
    # killed at 10+ points, before the commit (old state) and after it (new state)
    assert len(killed) > 10 and outcomes["old"] > 0 and outcomes["new"] > 0
    assert killed[len(labels) + 1] is False and all(killed[k] for k in killed if k <= len(labels))


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# -- disk full and permission denied ------------------------------------------------------------------
_FILL = r"""
import resource, signal, sys
import torch
from torch import nn
from accel_bigmodel.offload import offload_state_dict
from accel_bigmodel.sharding import save_sharded

folder, what = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing
torch.manual_seed(2)
net = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 8))
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    if what == "sharded":
        save_sharded(net.state_dict(), folder, max_shard_size=200_000)
    else:
        offload_state_dict(folder, net.state_dict())
except OSError as err:
    print(type(err).__name__, err)
    sys.exit(3)
"""


@pytest.mark.parametrize("what", ["sharded", "offload"])
def test_disk_full_names_the_path_and_keeps_the_previous_save(tmp_path: Path, what: str) -> None:
    folder = tmp_path / "out"
    if what == "sharded":
        save_sharded(_net(1).state_dict(), folder, max_shard_size=3000)
    else:
        offload_state_dict(folder, _net(1).state_dict())
    before = sorted(os.listdir(folder))
    script = tmp_path / "fill.py"
    script.write_text(_FILL)
    run = subprocess.run([sys.executable, str(script), str(folder), what], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr[-2000:]
    assert "CheckpointWriteError" in run.stdout and "File too large" in run.stdout and str(folder) in run.stdout
    assert sorted(os.listdir(folder)) == before  # nothing partial left
    if what == "sharded":
        assert _equal(_load(folder), state_values(_net(1)))
    else:
        loader = OffloadedWeightsLoader(save_folder=folder)
        assert all(torch.equal(loader[k], v) for k, v in state_values(_net(1)).items())


def _read_only(folder: Path) -> bool:
    """Make ``folder`` unwritable, also for root (immutable attribute); False when that is not possible."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return True
    return (
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        if shutil.which("chattr")
        else False
    )


def _writable(folder: Path) -> None:
    if os.geteuid() != 0:
        folder.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def test_read_only_folder_names_the_path_and_keeps_the_previous_save(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    save_sharded(_net(1).state_dict(), folder, max_shard_size=3000)
    before = sorted(os.listdir(folder))
    if not _read_only(folder):
        pytest.skip("cannot make a folder read-only here (root without chattr)")
    try:
        with pytest.raises(CheckpointWriteError) as info:
            save_sharded(_net(2).state_dict(), folder, max_shard_size=3000)
        assert str(folder) in str(info.value) and info.value.strerror in str(info.value)
        assert sorted(os.listdir(folder)) == before
        assert _equal(_load(folder), state_values(_net(1)))
    finally:
        _writable(folder)

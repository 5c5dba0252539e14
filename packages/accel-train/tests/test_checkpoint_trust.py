"""Checkpoint trust: a crafted pickle in any position of any backend's checkpoint runs nothing and changes
nothing; merge-weights refuses it too; write errors name the path and the OS reason and leave nothing
partial. (One process: FSDP and DCP checkpoints are written by a single-process FSDP run; the two-process
and DeepSpeed cases are in ``test_checkpoint_trust_distributed.py``.)"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from fsdp_helpers import BlockNet, crafted_torch_file, regression_batches, replace_dcp_item

from accel_state.errors import UnsafeCheckpointError
from accel_state.testing import reset_shared_state


class Exploit:
    """Writes a marker file when unpickled (what a crafted checkpoint does)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _accelerator(sharded: bool):
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    if not sharded:
        return Accelerator(cpu=True)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    return Accelerator(cpu=True, fsdp_plugin=plugin)


def _trained(accelerator, steps: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for x, y in regression_batches(steps, 8, seed=seed):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def _more(accelerator, model, optimizer) -> None:
    for x, y in regression_batches(1, 8, seed=5):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def _snapshot(accelerator, model, optimizer) -> tuple[dict, dict]:
    params = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    opt = {
        id_: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for id_, s in enumerate(optimizer.optimizer.state.values())
    }
    return params, opt


def _assert_same(before: tuple[dict, dict], after: tuple[dict, dict]) -> None:
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), f"parameter {name} changed"
    assert before[1].keys() == after[1].keys()
    for index, state in before[1].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(after[1][index][key]), torch.as_tensor(value)), f"optimizer {key}"


def _crafted_pickle(path: str, marker: str) -> None:
    with open(path, "wb") as handle:
        pickle.dump(Exploit(marker), handle)


def _crafted_dcp_item(folder: str, marker: str) -> None:
    """Rewrite the DCP folder with the same items, one non-tensor item replaced by a crafted object."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(
        state, storage_reader=dcp.FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    top = next(iter(state.values()))
    if "param_groups" in top:  # an optimizer folder: its learning rate becomes the crafted object
        top["param_groups"][0]["lr"] = Exploit(marker)
    else:
        top["crafted"] = Exploit(marker)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    dcp.save(state, checkpoint_id=folder, no_dist=True)


@pytest.mark.parametrize(
    ("sharded", "position"),
    [
        (True, "pytorch_model_fsdp_0/.metadata"),
        (True, "optimizer_0/.metadata"),
        (True, "optimizer_0/item"),
        (True, "pytorch_model_fsdp_0/item"),
        (True, "pytorch_model_fsdp_0/tensor"),
        (True, "optimizer_0/tensor"),
        (True, "scheduler.bin"),
        (False, "optimizer.bin"),
        (False, "scheduler.bin"),
    ],
)
def test_crafted_file_runs_nothing_and_changes_nothing(tmp_path, sharded: bool, position: str) -> None:
    accelerator = _accelerator(sharded)
    model, optimizer, _ = _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    marker = str(tmp_path / "marker")
    target = os.path.join(folder, position)
    if position.endswith("/item"):
        _crafted_dcp_item(os.path.dirname(target), marker)
        named = os.path.dirname(target)
    elif position.endswith("/tensor"):  # a tensor item of the saved layout points at a crafted pickle
        replace_dcp_item(os.path.dirname(target), "first", crafted_torch_file(marker))
        named = os.path.dirname(target)
    else:
        _crafted_pickle(target, marker)
        named = target
    _more(accelerator, model, optimizer)  # so that a load would visibly change the model and the optimizer
    before = _snapshot(accelerator, model, optimizer)
    with pytest.raises(UnsafeCheckpointError) as raised:
        accelerator.load_state(folder)
    assert not os.path.exists(marker), "the crafted pickle ran"
    assert named in str(raised.value) or raised.value.path.startswith(named)
    assert "GLOBAL" in raised.value.found or "exec" in raised.value.found
    _assert_same(before, _snapshot(accelerator, model, optimizer))
    reset_shared_state()


def test_unsafe_error_is_a_value_error_naming_file_and_finding() -> None:
    error = UnsafeCheckpointError("/ckpt/optimizer.bin", "GLOBAL builtins.exec")
    assert isinstance(error, ValueError)
    assert "/ckpt/optimizer.bin" in str(error) and "GLOBAL builtins.exec" in str(error)
    assert pickle.loads(pickle.dumps(error)).path == error.path


def test_sharded_checkpoint_still_loads_and_is_readable_by_torch(tmp_path) -> None:
    """The checks refuse nothing DCP writes, and the layout stays DCP's own (torch reads it unaided)."""
    accelerator = _accelerator(True)
    model, optimizer, _ = _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    saved = _snapshot(accelerator, model, optimizer)
    _more(accelerator, model, optimizer)
    accelerator.load_state(folder)
    _assert_same(saved, _snapshot(accelerator, model, optimizer))
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(os.path.join(folder, "pytorch_model_fsdp_0")).read_metadata()
    assert any(key.startswith("model.") for key in metadata.state_dict_metadata)
    reset_shared_state()


def test_dcp_items_are_read_as_torch_reads_them(tmp_path) -> None:
    """The pickle of every item, found by accel's zip reading, is the one torch's own reader finds; a zip
    laid out otherwise (a compressed pickle) goes to torch's reader, and a crafted one is still refused."""
    import zipfile

    from torch.distributed.checkpoint.utils import _create_file_view

    from accel_train.checkpoint.file_io import CheckpointIO
    from accel_train.checkpoint.safety import _zip_pickle, read_dcp_metadata

    accelerator = _accelerator(True)
    _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    reset_shared_state()
    checked = 0
    for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
        metadata = read_dcp_metadata(os.path.join(folder, sub, ".metadata"))
        for info in metadata.storage_data.values():
            path = os.path.join(folder, sub, str(info.relative_path))
            fd = os.open(path, os.O_RDONLY)
            try:
                found = _zip_pickle(fd, info.offset, info.length)
            finally:
                os.close(fd)
            with open(path, "rb") as stream:
                view = _create_file_view(stream, info.offset, info.length)
                assert found == torch._C.PyTorchFileReader(view).get_record("data.pkl")
            checked += 1
    assert checked > 20
    marker = str(tmp_path / "marker")
    crafted = crafted_torch_file(marker)
    with zipfile.ZipFile(io.BytesIO(crafted)) as plain:
        records = {name: plain.read(name) for name in plain.namelist()}
    deflated = io.BytesIO()
    with zipfile.ZipFile(deflated, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for name, data in records.items():
            packed.writestr(name, data)
    model_dir = os.path.join(folder, "pytorch_model_fsdp_0")
    replace_dcp_item(model_dir, "last", deflated.getvalue())
    fd = os.open(os.path.join(model_dir, "__0_0.distcp"), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert _zip_pickle(fd, size - len(deflated.getvalue()), len(deflated.getvalue())) is None
    finally:
        os.close(fd)
    with pytest.raises(UnsafeCheckpointError, match="GLOBAL builtins.exec"):
        CheckpointIO().check_sharded(model_dir)
    assert not os.path.exists(marker)


def test_merge_weights_refuses_crafted_folder(tmp_path, capsys) -> None:
    from accel_train.commands.merge import main

    accelerator = _accelerator(True)
    _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    reset_shared_state()
    marker = str(tmp_path / "marker")
    model_dir = os.path.join(folder, "pytorch_model_fsdp_0")
    out = str(tmp_path / "merged")
    assert main([model_dir, out]) == 0  # the genuine folder merges
    for position in ("metadata", "item"):
        if position == "metadata":
            _crafted_pickle(os.path.join(model_dir, ".metadata"), marker)
        else:
            accelerator = _accelerator(True)
            _trained(accelerator)
            accelerator.save_state(folder)
            reset_shared_state()
            _crafted_dcp_item(model_dir, marker)
        before = sorted(os.listdir(out))
        assert main([model_dir, out, "--max_shard_size", "1KB"]) == 2
        assert "accel merge-weights:" in capsys.readouterr().err
        assert not os.path.exists(marker)
        assert sorted(os.listdir(out)) == before, "a refused merge changed the previous output"


@contextlib.contextmanager
def _mount(path: str, options: str):
    """A small tmpfs at ``path`` (root only); skips the test where mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


# A save under a file-size limit runs in a process of its own (the limit is the process's); the other saves of
# these tests, which fail on the folder they write into, run in this one (_save_here): the same save, and no
# interpreter to start.
_SAVE_SCRIPT = """
import os, resource, signal, sys, torch
from accel_train import Accelerator
a = Accelerator(cpu=True)
torch.manual_seed(int(sys.argv[2]))
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
model, optimizer = a.prepare(model, optimizer)
model(torch.randn(2, 256)).sum().backward(); optimizer.step()
if len(sys.argv) > 3:  # a file-size limit: writes past it fail with EFBIG (as a full disk fails with ENOSPC)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
try:
    a.save_state(sys.argv[1])
    print("SAVED")
except OSError as e:
    print("ERROR", e)
"""


def _save(folder: str, seed: int, limit: int | None = None) -> str:
    args = [sys.executable, "-c", _SAVE_SCRIPT, folder, str(seed)] + ([str(limit)] if limit else [])
    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert "SAVED" in result.stdout or "ERROR" in result.stdout, result.stdout + result.stderr[-3000:]
    return result.stdout


def _save_here(folder: str, seed: int) -> str:
    """``_SAVE_SCRIPT``'s save (no limit) in this process; what the script would print."""
    accelerator = _accelerator(False)
    torch.manual_seed(seed)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    try:
        accelerator.save_state(folder)
    except OSError as error:
        return f"ERROR {error}"
    return "SAVED"


def _weights(folder: str) -> torch.Tensor:
    from accel_train.checkpoint.file_io import load_weights

    return load_weights(os.path.join(folder, "model.safetensors"))["weight"]


def test_save_to_read_only_folder_names_path_and_reason(tmp_path) -> None:
    """A read-only folder: the error names the path and the reason; nothing is left behind."""
    target = str(tmp_path / "locked")
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount
        context = _mount(target, "ro,size=1m")
        reason = "Read-only file system"
    else:
        os.makedirs(target)
        os.chmod(target, 0o555)
        context = contextlib.nullcontext(target)
        reason = "Permission denied"
    with context:
        out = _save_here(os.path.join(target, "ckpt"), 0)
        assert out.startswith("ERROR") and reason in out and target in out, out
        assert os.listdir(target) == []


@pytest.mark.parametrize("kind", ["disk_full", "file_size_limit"])
def test_save_on_full_disk_names_path_and_reason_and_keeps_previous(tmp_path, kind: str) -> None:
    """Disk full (a 2 MB tmpfs, root only) or a file-size limit (RLIMIT_FSIZE) during save_state over an
    earlier checkpoint: the error names the file and the OS reason, no partial folder stays, the earlier
    checkpoint loads as it was."""
    base = str(tmp_path / "disk")
    context = _mount(base, "size=2m") if kind == "disk_full" else contextlib.nullcontext(base)
    with context:
        os.makedirs(base, exist_ok=True)
        folder = os.path.join(base, "ckpt")
        assert _save_here(folder, 0).startswith("SAVED")
        previous = _weights(folder)
        if kind == "disk_full":
            stats = os.statvfs(base)
            with open(os.path.join(base, "filler"), "wb") as handle:  # leave less than a checkpoint free
                handle.write(b"\0" * (stats.f_bavail * stats.f_frsize - 300 * 1024))
            out = _save_here(folder, 1)
            assert "No space left on device" in out, out
        else:
            out = _save(folder, 1, limit=100_000)
            assert "File too large" in out, out
        assert out.startswith("ERROR") and re.search(re.escape(base) + r"/\.ckpt\.[0-9a-f]+\.partial", out), out
        assert sorted(os.listdir(base)) == sorted(["ckpt"] + (["filler"] if kind == "disk_full" else []))
        assert torch.equal(_weights(folder), previous)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_sharded_folder_naming_missing_or_shorter_files_is_refused(tmp_path, damage: str) -> None:
    """A DCP folder whose metadata names a data file that is gone, or shorter than recorded (a mix of two
    saves, a copy cut short), is refused before anything is loaded."""
    accelerator = _accelerator(True)
    model, optimizer, _ = _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    data = os.path.join(folder, "optimizer_0", "__0_0.distcp")
    if damage == "missing":
        os.remove(data)
    else:
        with open(data, "r+b") as handle:
            handle.truncate(os.path.getsize(data) // 2)
    _more(accelerator, model, optimizer)
    before = _snapshot(accelerator, model, optimizer)
    error = FileNotFoundError if damage == "missing" else ValueError
    with pytest.raises(error, match="__0_0.distcp"):
        accelerator.load_state(folder)
    _assert_same(before, _snapshot(accelerator, model, optimizer))
    reset_shared_state()


def test_user_folders_inside_a_checkpoint_are_not_read(tmp_path) -> None:
    """Only the layout's files are checked and read: a folder of the user's kept in the checkpoint is left alone."""
    accelerator = _accelerator(False)
    _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    os.makedirs(os.path.join(folder, "notes"))
    _crafted_pickle(os.path.join(folder, "notes", "mine.pkl"), str(tmp_path / "marker"))
    accelerator.load_state(folder)
    assert not os.path.exists(tmp_path / "marker")
    reset_shared_state()


def test_deepspeed_partitions_counted_for_resharding(tmp_path) -> None:
    """The number of processes a ZeRO checkpoint was partitioned over (another number goes through DeepSpeed's
    universal checkpoint, tested in test_deepspeed_reshard_distributed.py)."""
    from accel_train.checkpoint.deepspeed_universal import saved_world_size, universal_dir

    tag = tmp_path / "pytorch_model"
    assert saved_world_size(str(tag)) is None
    tag.mkdir()
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert saved_world_size(str(tag)) is None  # no optimizer partitions
    for rank in range(2):
        (tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert saved_world_size(str(tag)) == 2
    assert universal_dir(str(tmp_path / "ckpt")) == str(tmp_path / ".ckpt.universal")


def _lying_metadata(model_dir: str, parts_before: tuple[str, ...]) -> None:
    """Rewrite ``model_dir/.metadata`` so that every data file is a ``PosixPath`` of ``parts_before`` + the
    file name, whose cached string is the file name alone (what ``os.fspath`` would report)."""

    class LyingPath:
        def __init__(self, name: str) -> None:
            self.name = name

        def __reduce__(self):
            import pathlib

            return (pathlib.PosixPath, (*parts_before, self.name), (None, {"_str": self.name}))

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    path = os.path.join(model_dir, ".metadata")
    with open(path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file
    for index, info in list(metadata.storage_data.items()):
        metadata.storage_data[index] = _StorageInfo(LyingPath(info.relative_path), info.offset, info.length)
    with open(path, "wb") as handle:
        pickle.dump(metadata, handle)


def test_a_path_in_metadata_that_lies_about_its_folder_is_refused(tmp_path) -> None:
    """Issue 36, point 2: a ``.metadata`` whose data files are path objects joined out of the folder (to
    another checkpoint of the same shapes) while their cached string names the file inside is refused by
    name, by load_state and by merge-weights; no weight comes from the other checkpoint."""
    from accel_train.commands.merge import main

    accelerator = _accelerator(True)
    _trained(accelerator, seed=1)
    accelerator.save_state(str(tmp_path / "outside"))  # the weights the lying paths point at
    reset_shared_state()
    accelerator = _accelerator(True)
    model, optimizer, _ = _trained(accelerator)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    model_dir = os.path.join(folder, "pytorch_model_fsdp_0")
    _lying_metadata(model_dir, ("..", "..", "outside", "pytorch_model_fsdp_0"))
    _more(accelerator, model, optimizer)
    before = _snapshot(accelerator, model, optimizer)
    with pytest.raises(UnsafeCheckpointError, match="pickled state of its own") as raised:
        accelerator.load_state(folder)
    assert raised.value.path == os.path.join(model_dir, ".metadata")
    _assert_same(before, _snapshot(accelerator, model, optimizer))
    reset_shared_state()
    out = str(tmp_path / "merged")
    assert main([model_dir, out]) == 2
    assert not os.path.exists(out)


def _engine_folder(folder, marker: str, planted_metadata: bool) -> str:
    """A DeepSpeed engine folder (``pytorch_model/``) whose model states are crafted; with
    ``planted_metadata`` an empty DCP ``Metadata()`` lies beside them as ``.metadata``."""
    from torch.distributed.checkpoint.metadata import Metadata

    engine = folder / "pytorch_model"
    engine.mkdir(parents=True)
    (engine / "mp_rank_00_model_states.pt").write_bytes(crafted_torch_file(marker))
    if planted_metadata:
        (engine / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    return str(engine)


def test_a_planted_metadata_turns_no_engine_check_off(tmp_path) -> None:
    """Issue 36, point 1 (no DeepSpeed needed; the real ZeRO-2 case is in
    ``test_checkpoint_trust_distributed.py``): the kind of a folder comes from the layout, so a DCP
    ``.metadata`` in an engine folder is refused by name instead of making the check skip its ``.pt`` files,
    by the load check and by merge-weights on the save_state folder or the engine folder."""
    from accel_train.checkpoint.file_io import CheckpointIO
    from accel_train.checkpointing import check_folder
    from accel_train.commands.merge import main

    marker = str(tmp_path / "marker")
    _engine_folder(tmp_path / "crafted", marker, planted_metadata=False)
    with pytest.raises(UnsafeCheckpointError, match="GLOBAL builtins.exec"):
        check_folder(str(tmp_path / "crafted"), CheckpointIO())
    engine = _engine_folder(tmp_path / "planted", marker, planted_metadata=True)
    with pytest.raises(UnsafeCheckpointError, match="inside a DeepSpeed engine folder") as raised:
        check_folder(str(tmp_path / "planted"), CheckpointIO())
    assert raised.value.path == os.path.join(engine, ".metadata")
    for given in (str(tmp_path / "planted"), engine):
        assert main([given, str(tmp_path / "merged")]) == 2
        assert not os.path.exists(tmp_path / "merged")
    assert not os.path.exists(marker)

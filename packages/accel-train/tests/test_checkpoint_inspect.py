"""``accel checkpoint inspect`` (issue 40, part 3): the manifest, every file checked, where it loads.

Real ``save_state`` folders on one process (whole files, and FSDP2's DCP folders), then damaged: a file cut
short, a DCP shard resized under its ``.metadata``, a pickle planted that would run code, a file gone. The
command's main function runs in-process; one subprocess runs the module as a command and shows that the
manifest part imports no torch. The loading rules are checked on folders laid out by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from fsdp_helpers import crafted_torch_file

from accel_state.testing import reset_shared_state
from accel_train.checkpoint.inspection import inspect_checkpoint
from accel_train.checkpoint.portability import where_it_loads
from accel_train.commands import checkpoint as command


def _save(folder: str, sharded: bool = False) -> str:
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT") if sharded else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
    scheduler.step()
    accelerator.save_state(folder)
    reset_shared_state()
    return folder


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> str:
    """A single-device checkpoint (whole files), saved once for the module: each test copies it."""
    return _save(str(tmp_path_factory.mktemp("whole") / "ckpt"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> str:
    """An FSDP2 SHARDED_STATE_DICT checkpoint on one process (DCP folders)."""
    return _save(str(tmp_path_factory.mktemp("sharded") / "ckpt"), sharded=True)


def _copy(folder: str, tmp_path) -> str:
    return shutil.copytree(folder, str(tmp_path / "copy"))


def _inspect(folder: str, capsys, *flags: str) -> tuple[int, dict]:
    status = command.main(["inspect", folder, "--json", *flags])
    return status, json.loads(capsys.readouterr().out)


def _truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(keep)


def test_a_good_checkpoint_is_described_checked_and_exits_0(whole, capsys) -> None:
    status, report = _inspect(whole, capsys)
    assert status == command.EXIT_GOOD and report["status"] == "good" and report["problems"] == []
    assert report["manifest"]["strategy"] == "single_device" and report["manifest"]["num_processes"] == 1
    assert all(item["checked"] for item in report["files"]), report["files"]
    sizes = {item["path"]: item["size"] for item in report["files"]}
    assert sizes["model.safetensors"] == os.path.getsize(os.path.join(whole, "model.safetensors"))
    assert report["loads_on"]["process_counts"] == "any" and "ddp" in report["loads_on"]["backends"]

    assert command.main(["inspect", whole]) == 0
    text = capsys.readouterr().out
    assert "strategy: single_device" in text and "processes: any" in text and text.rstrip().endswith("status: good")


def test_every_damaged_file_is_named_and_exits_1(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    for name in ("model.safetensors", "optimizer.bin"):
        path = os.path.join(folder, name)
        _truncate(path, os.path.getsize(path) // 2)
    status, report = _inspect(folder, capsys)
    assert status == command.EXIT_DAMAGED and report["status"] == "damaged"
    assert [(p["path"], p["kind"]) for p in report["problems"]] == [
        ("model.safetensors", "damaged"),
        ("optimizer.bin", "damaged"),
    ]
    assert "model.safetensors" in report["problems"][0]["message"]


def test_a_resized_shard_is_named_and_the_other_folder_still_checked(sharded, tmp_path, capsys) -> None:
    folder = _copy(sharded, tmp_path)
    shard = os.path.join(folder, "optimizer_0", "__0_0.distcp")
    _truncate(shard, os.path.getsize(shard) - 16)
    status, report = _inspect(folder, capsys)
    assert status == command.EXIT_DAMAGED
    recorded, problem = report["problems"]  # the manifest's record names the file, the DCP check its folder
    assert recorded["path"] == "optimizer_0/__0_0.distcp" and recorded["kind"] == "damaged"
    assert problem["path"] == "optimizer_0" and problem["kind"] == "damaged" and "__0_0.distcp" in problem["message"]
    checked = {item["path"] for item in report["files"] if item["checked"]}
    assert "pytorch_model_fsdp_0/__0_0.distcp" in checked
    assert report["loads_on"]["process_counts"] == "any"
    assert report["loads_on"]["backends"] == ["fsdp", "nd_parallel"]


def test_a_planted_pickle_is_unsafe_runs_nothing_and_exits_3(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    marker = str(tmp_path / "marker")
    with open(os.path.join(folder, "scheduler.bin"), "wb") as handle:
        handle.write(crafted_torch_file(marker))
    model = os.path.join(folder, "model.safetensors")
    _truncate(model, os.path.getsize(model) // 2)  # damaged too: unsafe wins
    status, report = _inspect(folder, capsys)
    assert not os.path.exists(marker), "the planted pickle ran"
    assert status == command.EXIT_UNSAFE and report["status"] == "unsafe"
    kinds = {p["path"]: p["kind"] for p in report["problems"]}
    assert kinds == {"model.safetensors": "damaged", "scheduler.bin": "unsafe"}
    assert "exec" in next(p["message"] for p in report["problems"] if p["kind"] == "unsafe")


def test_a_file_the_manifest_lists_that_is_gone_is_missing(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    os.remove(os.path.join(folder, "random_states_0.safetensors"))
    status, report = _inspect(folder, capsys, "--manifest-only")
    assert status == command.EXIT_DAMAGED
    assert [(p["path"], p["kind"]) for p in report["problems"]] == [("random_states_0.safetensors", "missing")]


@pytest.mark.parametrize(("process_files", "missing"), [(None, ["random_states_1.safetensors"]), ("callers", [])])
def test_random_states_expected_of_every_process_unless_only_callers_wrote_them(
    whole, tmp_path, process_files, missing
) -> None:
    folder = _copy(whole, tmp_path)
    path = os.path.join(folder, "accel_checkpoint.json")
    manifest = json.loads(open(path, encoding="utf-8").read())
    manifest["num_processes"] = 2
    if process_files:
        manifest["process_files"] = process_files
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    report = inspect_checkpoint(folder, check_files=False)
    assert [p["path"] for p in report["problems"]] == missing


def test_not_a_folder_exits_2(tmp_path, capsys) -> None:
    assert command.main(["inspect", str(tmp_path / "absent")]) == command.EXIT_NOT_A_CHECKPOINT
    assert "is not a checkpoint folder" in capsys.readouterr().err


def test_the_registered_command_runs_under_accel(whole, monkeypatch, capsys) -> None:
    """The entry point this package registers, given to the real ``accel`` parser (the installed package
    metadata may predate it, so it is added to what the parser discovers)."""
    tomllib = pytest.importorskip("tomllib")
    cli = pytest.importorskip("accel_launch.cli")
    pyproject = os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")
    with open(pyproject, "rb") as handle:
        target = tomllib.load(handle)["project"]["entry-points"]["accel.commands"]["checkpoint"]
    discovered = cli.entry_points_of
    monkeypatch.setattr(cli, "entry_points_of", lambda group=cli.GROUP: {**discovered(group), "checkpoint": target})
    assert cli.main(["checkpoint", "inspect", whole, "--manifest-only"]) == command.EXIT_GOOD
    assert "status: unchecked" in capsys.readouterr().out
    assert cli.main(["checkpoint"]) == command.EXIT_NOT_A_CHECKPOINT  # no sub-command: its help
    assert "inspect" in capsys.readouterr().out


def test_the_command_runs_and_its_manifest_part_imports_no_torch(whole, tmp_path) -> None:
    """One subprocess: ``--manifest-only`` through the command's main imports no torch; then the module run
    as a command on a planted checkpoint exits 3."""
    folder = _copy(whole, tmp_path)
    with open(os.path.join(folder, "optimizer.bin"), "wb") as handle:
        handle.write(crafted_torch_file(str(tmp_path / "marker")))
    code = (
        "import subprocess, sys\n"
        "from accel_train.commands.checkpoint import main\n"
        f"assert main(['inspect', {folder!r}, '--manifest-only', '--json']) == 1\n"  # not its recorded size
        "print('torch imported:', 'torch' in sys.modules)\n"
        "sys.stdout.flush()\n"
        f"sys.exit(subprocess.call([sys.executable, '-m', 'accel_train.commands.checkpoint', 'inspect', {folder!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "torch imported: False" in result.stdout, result.stdout + result.stderr
    assert result.returncode == command.EXIT_UNSAFE, result.stdout + result.stderr
    assert "unsafe: optimizer.bin" in result.stdout and not os.path.exists(tmp_path / "marker")


# -- the manifest's record of the files and of the save ---------------------------------------------------


def _manifest(folder: str) -> dict:
    with open(os.path.join(folder, "accel_checkpoint.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _rewrite_manifest(folder: str, **changes) -> None:
    manifest = {**_manifest(folder), **changes}
    manifest = {key: value for key, value in manifest.items() if value is not None}
    with open(os.path.join(folder, "accel_checkpoint.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)


@pytest.mark.parametrize("kind", ["whole", "sharded"])
def test_the_manifest_records_every_file_and_the_save_id_the_safetensors_carry(request, kind, capsys) -> None:
    from accel_train.checkpoint.file_record import record_files
    from accel_train.checkpoint.save_id import header_save_id

    folder = request.getfixturevalue(kind)
    manifest = _manifest(folder)
    assert manifest["files"] == record_files(folder) and "accel_checkpoint.json" not in manifest["files"]
    assert len(manifest["save_id"]) == 32 and int(manifest["save_id"], 16) >= 0
    if kind == "sharded":  # the DCP folders' files, by their path inside the checkpoint
        assert {"optimizer_0/.metadata", "optimizer_0/__0_0.distcp", "pytorch_model_fsdp_0/.metadata"} <= set(
            manifest["files"]
        )
    carriers = [path for path in manifest["files"] if path.endswith(".safetensors")]
    assert "random_states_0.safetensors" in carriers
    assert {path: header_save_id(os.path.join(folder, path)) for path in carriers} == dict.fromkeys(
        carriers, manifest["save_id"]
    )

    status, report = _inspect(folder, capsys)
    assert status == command.EXIT_GOOD and report["problems"] == [] and report["notes"] == []
    assert report["save_id"] == manifest["save_id"]
    assert all(item["recorded"] == item["size"] for item in report["files"] if item["path"] != "accel_checkpoint.json")
    command.main(["inspect", folder, "--manifest-only"])
    text = capsys.readouterr().out
    assert f"save id: {manifest['save_id']}" in text and "  files: " not in text  # not repeated as a field


def test_each_save_has_its_own_id(whole, tmp_path) -> None:
    again = _save(str(tmp_path / "again"))
    assert _manifest(again)["save_id"] != _manifest(whole)["save_id"]


def test_a_file_cut_short_is_named_with_both_sizes_without_reading_it(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    path = os.path.join(folder, "scheduler.bin")
    size = os.path.getsize(path)
    _truncate(path, size - 10)
    status, report = _inspect(folder, capsys, "--manifest-only")
    assert status == command.EXIT_DAMAGED and report["status"] == "damaged"
    (problem,) = report["problems"]
    assert (problem["path"], problem["kind"]) == ("scheduler.bin", "damaged")
    assert f"is {size - 10} bytes, but was {size} bytes when saved" in problem["message"]
    assert next(item for item in report["files"] if item["path"] == "scheduler.bin")["recorded"] == size
    command.main(["inspect", folder, "--manifest-only"])
    assert f"{size - 10}  scheduler.bin  recorded {size}" in capsys.readouterr().out


def test_a_recorded_file_that_is_gone_is_missing(sharded, tmp_path, capsys) -> None:
    """A file only the record knows of (a DCP data file; the manifest's entries name its folder)."""
    folder = _copy(sharded, tmp_path)
    os.remove(os.path.join(folder, "pytorch_model_fsdp_0", "__0_0.distcp"))
    status, report = _inspect(folder, capsys, "--manifest-only")
    assert status == command.EXIT_DAMAGED
    (problem,) = report["problems"]
    assert (problem["path"], problem["kind"]) == ("pytorch_model_fsdp_0/__0_0.distcp", "missing")
    assert "listed by the manifest" in problem["message"]


def test_a_file_missing_by_entry_and_by_record_is_reported_once(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    os.remove(os.path.join(folder, "optimizer.bin"))
    status, report = _inspect(folder, capsys, "--manifest-only")
    assert status == command.EXIT_DAMAGED
    assert [(p["path"], p["kind"]) for p in report["problems"]] == [("optimizer.bin", "missing")]


def test_a_file_added_after_the_save_is_a_note_not_a_failure(whole, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    os.makedirs(os.path.join(folder, "eval"))
    with open(os.path.join(folder, "eval", "scores.txt"), "w", encoding="utf-8") as handle:
        handle.write("0.93\n")
    status, report = _inspect(folder, capsys)
    assert status == command.EXIT_GOOD and report["problems"] == []
    (note,) = report["notes"]
    assert note["path"] == "eval/scores.txt" and "added after the save" in note["message"]
    assert next(item for item in report["files"] if item["path"] == "eval/scores.txt")["recorded"] is None
    command.main(["inspect", folder])
    assert "notes:\n  eval/scores.txt: " in capsys.readouterr().out


def test_the_random_states_other_processes_add_are_no_note_when_they_save_alone(whole, tmp_path) -> None:
    folder = _copy(whole, tmp_path)
    shutil.copyfile(
        os.path.join(folder, "random_states_0.safetensors"), os.path.join(folder, "random_states_1.safetensors")
    )
    assert [n["path"] for n in inspect_checkpoint(folder, check_files=False)["notes"]] == [
        "random_states_1.safetensors"
    ]
    _rewrite_manifest(folder, process_files="callers", num_processes=2)
    assert inspect_checkpoint(folder, check_files=False)["notes"] == []


def test_a_file_of_another_save_is_named_as_mixed(whole, sharded, tmp_path, capsys) -> None:
    folder = _copy(whole, tmp_path)
    shutil.copyfile(
        os.path.join(sharded, "random_states_0.safetensors"), os.path.join(folder, "random_states_0.safetensors")
    )
    status, report = _inspect(folder, capsys, "--manifest-only")
    assert status == command.EXIT_DAMAGED and report["status"] == "damaged"
    (problem,) = report["problems"]  # its size may differ too: one problem per file, the one that says why
    assert (problem["path"], problem["kind"]) == ("random_states_0.safetensors", "mixed")
    assert _manifest(sharded)["save_id"] in problem["message"] and _manifest(whole)["save_id"] in problem["message"]


def test_a_manifest_without_the_record_inspects_as_before(whole, tmp_path, capsys) -> None:
    """An older accel's manifest (no ``files``, no ``save_id``): no comparison, no note, nothing mixed."""
    folder = _copy(whole, tmp_path)
    _rewrite_manifest(folder, files=None, save_id=None)
    with open(os.path.join(folder, "notes.txt"), "w", encoding="utf-8") as handle:
        handle.write("mine")
    status, report = _inspect(folder, capsys)
    assert status == command.EXIT_GOOD and report["status"] == "good"
    assert report["save_id"] is None and report["notes"] == [] and report["problems"] == []
    assert all(item["recorded"] is None for item in report["files"])
    command.main(["inspect", folder])
    assert "save id:" not in capsys.readouterr().out


# -- where a folder loads (laid out by hand: only the names count) ------------------------------------------


def _layout(folder, manifest: dict | None, files: list[str]) -> str:
    for relative in files:
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    if manifest is not None:
        (folder / "accel_checkpoint.json").write_text(json.dumps(manifest))
    return str(folder)


@pytest.mark.parametrize(
    ("files", "counts", "backends"),
    [
        (["model.safetensors", "optimizer.bin"], "any", ["single_device", "ddp", "xla", "fsdp"]),
        (["pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata"], "any", ["fsdp", "nd_parallel"]),
        (["pytorch_model_fsdp_0/rank0.safetensors", "pytorch_model_fsdp_0/rank1.safetensors"], [2], ["fsdp"]),
        (["pytorch_model/mp_rank_00_model_states.pt", "deepspeed_optimizer.json"], "any", ["deepspeed"]),
        (["pytorch_model_pp_0/.metadata"], [2], ["pipeline"]),
        (["megatron_model_0/.metadata"], [2], ["megatron_lm"]),
        (["model.safetensors", "accumulated_grads_0.safetensors"], [2], ["single_device", "ddp", "xla", "fsdp"]),
    ],
)
def test_where_a_checkpoint_loads_follows_the_readers(tmp_path, files, counts, backends) -> None:
    folder = _layout(tmp_path, {"num_processes": 2}, files)
    where = where_it_loads(folder, {"num_processes": 2})
    assert (where["process_counts"], where["backends"]) == (counts, backends)
    if counts != "any":
        assert any("same number" in note or "not tested" in note for note in where["notes"])


def test_without_a_manifest_the_saved_count_is_unknown(tmp_path) -> None:
    folder = _layout(tmp_path, None, ["model.safetensors", "accumulated_grads_0.safetensors"])
    report = inspect_checkpoint(folder, check_files=False)
    assert report["manifest"] is None and report["loads_on"]["process_counts"] == []

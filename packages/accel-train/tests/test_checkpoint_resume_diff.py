"""A resume that says what changed (issue 40, part 2): the manifest records what the saving run was, and
``load_state`` logs one line per setting the resuming run changed, and keeps them as
``accelerator.checkpoint_differences``.

The comparison is pure (`accel_train.checkpoint.resume_diff`); a few real saves and loads on one process,
and one on two processes loaded on one, check that the lines come out where a user sees them.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from accel_state.errors import CorruptCheckpointError
from accel_state.testing import reset_shared_state
from accel_train.checkpoint.manifest import manifest_problem, read_manifest_file
from accel_train.checkpoint.resume_diff import CheckpointDifference, differences
from accel_train.checkpoint.run_record import data_position, plain

RUN = {
    "num_processes": 2,
    "strategy": "fsdp",
    "backend_settings": {"fsdp_version": 2, "sharding_strategy": "FULL_SHARD", "state_dict_type": "SHARDED_STATE_DICT"},
    "mesh": {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "cp": 1, "pp": 1},
    "mixed_precision": "no",
    "gradient_accumulation": {"steps": 2},
    "versions": {"accel-train": "0.1.0", "torch": "2.12.0"},
}


def _changed(**fields) -> dict:
    return {**json.loads(json.dumps(RUN)), **fields}


def _lines(saved: dict | None, current: dict) -> list[str]:
    return [str(d) for d in differences(saved, current)]


# -- the comparison ---------------------------------------------------------------------------------------


def test_identical_runs_differ_in_nothing() -> None:
    assert differences(RUN, _changed()) == []


def test_each_changed_setting_is_one_line() -> None:
    current = _changed(
        num_processes=1,
        mixed_precision="bf16",
        mesh={**RUN["mesh"], "dp_shard": 1},
        backend_settings={**RUN["backend_settings"], "sharding_strategy": "SHARD_GRAD_OP"},
        gradient_accumulation={"steps": 4},
        versions={"accel-train": "0.1.0", "torch": "2.13.0"},
    )
    assert _lines(RUN, current) == [
        "resume: num_processes 2 -> 1",
        "resume: mixed_precision no -> bf16",
        "resume: mesh.dp_shard 2 -> 1",
        "resume: backend.sharding_strategy FULL_SHARD -> SHARD_GRAD_OP",
        "resume: gradient_accumulation.steps 2 -> 4",
        "resume: torch 2.12.0 -> 2.13.0",
    ]


def test_a_library_only_one_run_imported_is_no_difference_but_a_new_version_is() -> None:
    """Whether a run imported DeepSpeed depends on what touched it first, not on the checkpoint."""
    current = _changed(versions={**RUN["versions"], "deepspeed": "0.19.0"})
    assert _lines(RUN, current) == []
    saved = _changed(versions={**RUN["versions"], "deepspeed": "0.18.0"})
    assert _lines(saved, current) == ["resume: deepspeed 0.18.0 -> 0.19.0"]


def test_another_backend_is_one_line_not_one_per_setting() -> None:
    current = _changed(strategy="ddp", backend_settings={})
    assert _lines(RUN, current) == ["resume: strategy fsdp -> ddp"]


def test_fields_an_older_manifest_lacks_are_not_compared() -> None:
    old = {"num_processes": 2, "step": 3, "strategy": "fsdp"}  # what accel wrote before issue 40
    assert _lines(old, _changed(num_processes=1)) == ["resume: num_processes 2 -> 1"]
    assert differences(None, RUN) == []


def test_a_mesh_dimension_an_older_manifest_lacks_reads_as_size_1() -> None:
    current = _changed(mesh={**RUN["mesh"], "ep": 1})  # "ep" recorded since expert parallelism (issue 42)
    assert differences(RUN, current) == [] and differences(current, RUN) == []
    assert _lines(RUN, _changed(mesh={**RUN["mesh"], "ep": 2})) == ["resume: mesh.ep 1 -> 2"]


def test_the_phase_of_the_save_is_no_difference() -> None:
    saved = _changed(gradient_accumulation={"steps": 2, "mid_accumulation": True})
    assert differences(saved, RUN) == []


def test_a_difference_keeps_its_values_for_scripts() -> None:
    (found,) = differences(RUN, _changed(num_processes=4))
    assert found == CheckpointDifference("num_processes", 2, 4)
    assert (found.field, found.saved, found.current) == ("num_processes", 2, 4)


# -- the manifest's fields --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("mesh", [2, 1], "'mesh'"),
        ("mesh", {"dp_shard": "2"}, "mesh['dp_shard']"),
        ("versions", {"torch": 2.13}, "versions['torch']"),
        ("data", {"epoch": 1}, "'data'"),
        ("mixed_precision", None, "'mixed_precision'"),
        ("save_id", 7, "'save_id'"),
        ("save_id", "", "an empty id"),
        ("files", ["model.safetensors"], "'files'"),
        ("files", {"model.safetensors": "12"}, "files['model.safetensors']"),
        ("files", {"model.safetensors": True}, "files['model.safetensors']"),
        ("files", {"model.safetensors": -1}, "a negative size"),
        ("files", {"../model.safetensors": 1}, "not a relative path inside the folder"),
        ("files", {"/etc/passwd": 1}, "not a relative path inside the folder"),
        ("files", {"optimizer_0//x": 1}, "not a relative path inside the folder"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_is_named(tmp_path, field: str, value, named: str) -> None:
    path = tmp_path / "accel_checkpoint.json"
    path.write_text(json.dumps({**RUN, field: value}))
    with pytest.raises(CorruptCheckpointError) as raised:
        read_manifest_file(str(path))
    assert named in str(raised.value)
    assert manifest_problem(RUN) is None


def test_the_record_of_the_save_round_trips_and_older_manifests_lack_it(tmp_path) -> None:
    from accel_train.checkpoint.file_io import read_manifest, write_manifest

    recorded = {"save_id": "0f" * 16, "files": {"model.safetensors": 1234, "optimizer_0/__0_0.distcp": 56}}
    write_manifest(str(tmp_path), {**RUN, **recorded})
    read = read_manifest(str(tmp_path))
    assert read is not None and {key: read[key] for key in recorded} == recorded and read["format_version"] == 1
    assert manifest_problem(RUN) is None  # both fields are optional


def test_data_position_counts_samples_over_every_process() -> None:
    class Loader:
        total_batch_size = 8

    assert data_position({"epoch": 1, "batches_yielded": 3}, Loader()) == {
        "epoch": 1,
        "batches_yielded": 3,
        "samples_seen": 24,
    }
    assert data_position({"epoch": 0}, object()) == {"epoch": 0, "batches_yielded": None, "samples_seen": None}


def test_plain_turns_settings_into_json_values() -> None:
    import enum

    class Stage(enum.Enum):
        _ZERO2 = 2

    assert plain({"stage": Stage._ZERO2, "sizes": (1, 2), "path": os.sep}) == {
        "stage": "ZERO2",
        "sizes": [1, 2],
        "path": os.sep,
    }


# -- save and load ----------------------------------------------------------------------------------------


def _prepared(mixed_precision: str = "no", steps: int = 1):
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision, gradient_accumulation_steps=steps)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.arange(48.0).reshape(12, 4), batch_size=2)
    return (accelerator, *accelerator.prepare(model, optimizer, loader))


def test_manifest_records_the_run_and_a_resume_logs_what_changed(tmp_path, caplog) -> None:
    accelerator, model, _optimizer, loader = _prepared(steps=2)
    batches = iter(loader)
    with accelerator.accumulate(model):  # the first of two micro-steps: the save falls mid-accumulation
        accelerator.backward(model(next(batches)).sum())
    next(batches)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    manifest = json.loads(open(os.path.join(folder, "accel_checkpoint.json"), encoding="utf-8").read())
    assert manifest["strategy"] == "single_device" and manifest["mixed_precision"] == "no"
    assert manifest["mesh"] == {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "cp": 1, "pp": 1, "ep": 1}
    assert manifest["gradient_accumulation"] == {"steps": 2, "mid_accumulation": True}
    assert manifest["data"] == [{"epoch": 0, "batches_yielded": 2, "samples_seen": 4}]
    assert manifest["versions"]["torch"] == torch.__version__ and "accel-train" in manifest["versions"]

    accelerator.load_state(folder)  # the same run: nothing to say
    assert accelerator.checkpoint_differences == ()

    resumed, *_ = _prepared(mixed_precision="bf16", steps=2)
    with caplog.at_level(logging.INFO, logger="accel_train"):
        resumed.load_state(folder)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert lines == ["resume: mixed_precision no -> bf16"]
    assert [str(d) for d in resumed.checkpoint_differences] == lines


def test_a_checkpoint_without_the_new_fields_loads_and_reports_what_it_can(tmp_path, caplog) -> None:
    accelerator, *_ = _prepared()
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    path = os.path.join(folder, "accel_checkpoint.json")
    manifest = json.loads(open(path, encoding="utf-8").read())
    for field in ("backend_settings", "mesh", "mixed_precision", "gradient_accumulation", "data", "versions"):
        del manifest[field]
    manifest["num_processes"] = 1
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    resumed, *_ = _prepared(mixed_precision="bf16")
    with caplog.at_level(logging.INFO, logger="accel_train"):
        resumed.load_state(folder)
    assert resumed.checkpoint_differences == ()
    assert not [r for r in caplog.records if r.getMessage().startswith("resume:")]


def _save_on_two(folder: str, numbered: bool = False) -> int:
    reset_shared_state()
    from accel_train import Accelerator, ProjectConfiguration

    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True) if numbered else None
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.save_state(None if numbered else folder)
    return accelerator.num_processes


def _save_ids(folder: str) -> tuple[str, dict[str, str | None]]:
    """The manifest's save id, and the one in the header of each process's random states."""
    from accel_train.checkpoint.save_id import header_save_id

    manifest = json.loads(open(os.path.join(folder, "accel_checkpoint.json"), encoding="utf-8").read())
    names = [f"random_states_{rank}.safetensors" for rank in (0, 1)]
    return manifest["save_id"], {name: header_save_id(os.path.join(folder, name)) for name in names}


@pytest.mark.parametrize("numbered", [False, True])
def test_every_process_marks_its_files_with_the_one_id_of_the_save(tmp_path, pools, numbered: bool) -> None:
    """DDP into an explicit folder (the main process publishes, the other adds its random states after, told
    the id through the store) and with automatic naming (every process writes into the partial folder,
    told process 0's id in the exchange that names it): one id, in the manifest and both files."""
    from accel_train.checkpoint.inspection import inspect_checkpoint

    base = str(tmp_path / "run")
    assert pools(2).run(_save_on_two, base, numbered) == [2, 2]
    folder = os.path.join(base, "checkpoints", "checkpoint_0") if numbered else base
    save_id, in_files = _save_ids(folder)
    assert in_files == dict.fromkeys(in_files, save_id)
    manifest = json.loads(open(os.path.join(folder, "accel_checkpoint.json"), encoding="utf-8").read())
    assert ("random_states_1.safetensors" in manifest["files"]) is numbered  # written before the publish
    report = inspect_checkpoint(folder, check_files=False)
    assert (report["problems"], report["notes"], report["status"]) == ([], [], "unchecked")


def test_two_processes_resumed_on_one_say_so(tmp_path, pools, caplog) -> None:
    folder = str(tmp_path / "ckpt")
    assert pools(2).run(_save_on_two, folder) == [2, 2]
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with caplog.at_level(logging.INFO, logger="accel_train"):
        accelerator.load_state(folder)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert lines == [
        "resume: num_processes 2 -> 1",
        "resume: strategy ddp -> single_device",
        "resume: mesh.dp_replicate 2 -> 1",
    ]

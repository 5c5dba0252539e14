"""What ``accel checkpoint inspect`` reports on a checkpoint folder: its manifest, every file with its
size and verdict, what is missing, and where the checkpoint loads.

The manifest, the listing, the files the manifest expects and the loading rules
(`accel_train.checkpoint.portability`) need no torch; the file checks are the ones ``load_state`` runs
before loading (`accel_train.checkpoint.checks.folder_checks`: damaged files from
`accel_train.checkpoint.integrity`, pickles against the allow-lists of `accel_train.checkpoint.safety`),
imported only when asked for. Unlike ``load_state``, which stops at the first problem, every file is
checked and every problem reported.

When the manifest records the folder's files (``files``, `accel_train.checkpoint.file_record`), each one is
compared with its record: gone (missing), another size (damaged, both sizes named) or not recorded (a note:
added after the save). When it records the save's id, each safetensors file whose header names another
save is reported (mixed: the folder holds files of two saves). These need no torch either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError
from accel_train.checkpoint.file_record import compare_files
from accel_train.checkpoint.manifest import read_manifest_file
from accel_train.checkpoint.names import FILE_NAMES, MANIFEST_NAME, rng_file
from accel_train.checkpoint.portability import where_it_loads
from accel_train.checkpoint.save_id import header_save_id

__all__ = ["DAMAGED", "GOOD", "MISSING", "MIXED", "UNCHECKED", "UNSAFE", "inspect_checkpoint"]

#: The verdicts of a report (``status``) and the kinds of its problems.
GOOD = "good"
UNCHECKED = "unchecked"
MISSING = "missing"
DAMAGED = "damaged"
UNSAFE = "unsafe"
#: A file written by another save than the manifest's (its header names another save id).
MIXED = "mixed"

#: The files each process adds to a folder its main process saved alone (``process_files: callers``).
_PER_PROCESS_RE = re.compile(rf"^(?:{FILE_NAMES['rng']}|{FILE_NAMES['grads']})_\d+\.safetensors$")

#: The manifest's lists of entries, with the kind of object each names.
_ENTRY_LISTS = {
    "models": "model",
    "optimizers": "optimizer",
    "schedulers": "scheduler",
    "dataloaders": "data loader",
    "custom": "custom object",
}


def _listing(folder: str) -> list[dict[str, Any]]:
    """Every file under ``folder``, relative to it and sorted, with its size in bytes."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            files.append({"path": os.path.relpath(path, folder), "size": os.path.getsize(path)})
    return files


def _expected(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(entry, what it is)`` for every entry the manifest says the folder holds."""
    expected: list[tuple[str, str]] = []
    for field, label in _ENTRY_LISTS.items():
        for index, entry in enumerate(manifest.get(field) or []):
            if isinstance(entry, str):
                expected.append((entry, f"{label} {index}"))
    if isinstance(manifest.get("scaler"), str):
        expected.append((manifest["scaler"], "fp16 gradient scaler"))
    processes = manifest.get("num_processes")
    if isinstance(processes, int) and manifest.get("process_files") != "callers":
        expected += [(rng_file(rank), f"random states of process {rank}") for rank in range(processes)]
    return expected


def _problem(path: str, error: BaseException) -> dict[str, str]:
    """A problem of the report from what a check raised (unsafe first: it is a ``ValueError`` too)."""
    if isinstance(error, UnsafeCheckpointError):
        kind = UNSAFE
    elif isinstance(error, FileNotFoundError):
        kind = MISSING
    else:
        kind = DAMAGED
    text = str(error) if isinstance(error, (CorruptCheckpointError, UnsafeCheckpointError, OSError)) else ""
    return {"path": path, "kind": kind, "message": text or f"{type(error).__name__}: {error}"}


def _record_findings(
    folder: str, manifest: Mapping[str, Any], files: list[dict[str, Any]]
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The problems and notes from comparing the folder with the manifest's record of it (``save_id`` and
    ``files``; a file of another save first: it says why its size differs too); each item of ``files``
    gains ``recorded``: its recorded size, or `None`."""
    recorded = manifest.get("files")
    problems: list[dict[str, str]] = []
    notes: list[dict[str, str]] = []
    sizes = recorded if isinstance(recorded, dict) else {}
    for item in files:
        item["recorded"] = sizes.get(item["path"])
    save_id = manifest.get("save_id")
    if isinstance(save_id, str):
        for item in files:
            if not item["path"].endswith(".safetensors"):
                continue
            other = header_save_id(os.path.join(folder, item["path"]))
            if other is not None and other != save_id:
                message = (
                    f"{item['path']} was written by save {other}, the manifest by save {save_id}: the folder "
                    "mixes files of two saves"
                )
                problems.append({"path": item["path"], "kind": MIXED, "message": message})
    if isinstance(recorded, dict):
        found = compare_files(folder, recorded)
        for path in found.missing:
            message = f"{path} is listed by the manifest ({recorded[path]} bytes when saved) but absent"
            problems.append({"path": path, "kind": MISSING, "message": message})
        for path, size, actual in found.resized:
            message = (
                f"{path} is {actual} bytes, but was {size} bytes when saved (the manifest's record): "
                "cut short, grown or replaced since"
            )
            problems.append({"path": path, "kind": DAMAGED, "message": message})
        callers = manifest.get("process_files") == "callers"
        for path in found.extra:
            if callers and _PER_PROCESS_RE.match(path):
                continue  # added by its process after the main process published the folder
            message = f"{path} is not in the manifest's record of the save's files: added after the save"
            notes.append({"path": path, "message": message})
    return problems, notes


def _merged(first: list[dict[str, str]], then: list[dict[str, str]]) -> list[dict[str, str]]:
    """``first`` and ``then`` with one problem per path: the first found, unless a later one is unsafe."""
    merged: dict[str, dict[str, str]] = {}
    for problem in [*first, *then]:
        known = merged.get(problem["path"])
        if known is None or (problem["kind"] == UNSAFE and known["kind"] != UNSAFE):
            merged[problem["path"]] = problem
    return list(merged.values())


def _io_and_entries(strategy: str | None) -> tuple[Any, Any]:
    """The `CheckpointIO` whose checks the backend that wrote the folder applies, and its own entries."""
    if strategy == "deepspeed":
        from accel_train.strategies.deepspeed.checkpoint import DeepSpeedCheckpointIO

        return DeepSpeedCheckpointIO(), None
    from accel_train.checkpoint.file_io import CheckpointIO

    if strategy == "pipeline":
        from accel_train.strategies.pipeline.strategy import CHECKPOINT_ENTRIES

        return CheckpointIO(), CHECKPOINT_ENTRIES
    if strategy == "megatron_lm":
        from accel_train.strategies.megatron.strategy import MegatronLMStrategy

        return CheckpointIO(), MegatronLMStrategy.checkpoint_entries(None)  # type: ignore[arg-type]  # no state read
    return CheckpointIO(), None


def _check_files(folder: str, strategy: str | None) -> tuple[set[str], list[dict[str, str]]]:
    """Run every check a load runs on ``folder``; returns the files checked and the problems found."""
    from accel_train.checkpoint.checks import folder_checks

    io_, entries = _io_and_entries(strategy)
    problems: list[dict[str, str]] = []
    checked: set[str] = set()
    broken: set[str] = set()

    def failed(entry: str, error: BaseException) -> None:
        broken.add(entry)
        problems.append(_problem(entry, error))

    for label, check in folder_checks(folder, io_, entries=entries, failed=failed):
        path = label.rsplit(":", 1)[0] if "@" not in label else label.split("@", 1)[0]
        checked.add(path)
        if path in broken:
            continue  # one problem per file: the first found
        try:
            check()
        except Exception as error:
            broken.add(path)
            problems.append(_problem(path, error))
    return checked | broken, problems


def inspect_checkpoint(folder: str, check_files: bool = True) -> dict[str, Any]:
    """Inspect the checkpoint ``folder``: a JSON-ready report.

    ``{"folder", "manifest", "save_id", "files": [{"path", "size", "recorded", "checked"}], "problems":
    [{"path", "kind", "message"}], "notes": [{"path", "message"}], "loads_on": {"process_counts",
    "backends", "notes"}, "status"}``, where ``save_id`` is the manifest's (`None` without one),
    ``recorded`` a file's size in the manifest's record (`None`: not recorded), a problem's kind is
    ``missing``, ``damaged``, ``mixed`` (written by another save than the manifest) or ``unsafe``, a note
    names a file present but not recorded, and ``status`` is ``unsafe`` when any file would run code, else
    ``damaged`` when any is missing, damaged or mixed, else ``good`` (``unchecked`` when the files were not
    checked and none is missing).

    Args:
        folder: the checkpoint folder (what ``save_state`` wrote).
        check_files: run the checks ``load_state`` runs on every file (imports torch); without them, only
            the manifest, the listing and the files the manifest expects are looked at (no torch).

    Raises:
        NotADirectoryError: ``folder`` is not a folder.
    """
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"{folder} is not a checkpoint folder (a folder written by save_state)")
    problems: list[dict[str, str]] = []
    manifest: dict[str, Any] | None = None
    manifest_path = os.path.join(folder, MANIFEST_NAME)
    if os.path.isfile(manifest_path):
        try:
            manifest = read_manifest_file(manifest_path)
        except CorruptCheckpointError as error:
            problems.append(_problem(MANIFEST_NAME, error))
    files = _listing(folder)
    for entry, what in _expected(manifest or {}):
        if not os.path.exists(os.path.join(folder, entry)):
            problems.append(
                {"path": entry, "kind": MISSING, "message": f"{entry} ({what}) is listed by the manifest but absent"}
            )
    recorded, notes = _record_findings(folder, manifest or {}, files)
    problems = _merged(problems, recorded)
    checked: set[str] = {MANIFEST_NAME} if os.path.isfile(manifest_path) else set()  # read and validated
    if check_files:
        found_checked, found = _check_files(folder, (manifest or {}).get("strategy"))
        checked |= found_checked
        problems = _merged(problems, found)
    read_folders = {path.split("/", 1)[0] for path in checked if "/" in path}  # their .metadata was read
    for item in files:
        path = item["path"]
        item["checked"] = path in checked or (
            os.path.basename(path) == ".metadata" and os.path.dirname(path) in read_folders
        )
    kinds = {problem["kind"] for problem in problems}
    if UNSAFE in kinds:
        status = UNSAFE
    elif kinds:
        status = DAMAGED
    else:
        status = GOOD if check_files else UNCHECKED
    return {
        "folder": os.path.abspath(folder),
        "manifest": manifest,
        "save_id": (manifest or {}).get("save_id"),
        "files": files,
        "problems": problems,
        "notes": notes,
        "loads_on": where_it_loads(folder, manifest),
        "status": status,
    }

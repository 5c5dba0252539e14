"""The checkpoint's manifest, ``accel_checkpoint.json``: its fields, and reading it without torch.

The manifest says what a checkpoint holds (its entries) and what the run that wrote it was (world size,
mesh, backend and its settings, precision, data position, accumulation phase, library versions), so
that ``load_state`` can say what differs in the resuming run and ``accel checkpoint inspect`` can say
where the checkpoint loads. Every field may be absent (a manifest of an older accel, or of another
writer), and this module imports neither torch nor any checkpoint reader: reading a manifest is cheap.

==========================  ==========  ==================================================================
field                       type        what
==========================  ==========  ==================================================================
``format_version``          int         the manifest's format (1)
``num_processes``           int         the world size of the run that saved
``step``                    int/null    the Accelerator's step counter
``safe_serialization``      bool        model weights as safetensors (else ``torch.save``)
``strategy``                str         the backend: ``single_device``, ``ddp``, ``fsdp``, ``deepspeed`` ...
``backend_settings``        object      the backend's main settings as plain JSON values (FSDP version,
                                        sharding strategy, state-dict type; ZeRO stage ...)
``mesh``                    object      size of each parallel dimension (``dp_replicate``, ``dp_shard``,
                                        ``tp``, ``cp``, ``pp``)
``mixed_precision``         str         ``no``, ``fp16``, ``bf16`` or ``fp8``
``gradient_accumulation``   object      ``steps`` and ``mid_accumulation`` (saved between two optimizer
                                        steps: each process's gradients so far are in the checkpoint)
``data``                    list        per prepared data loader: ``epoch``, ``batches_yielded`` and
                                        ``samples_seen`` in that epoch (null where the loader cannot say)
``versions``                object      ``accel-train``, ``torch``, and ``deepspeed`` / ``transformers``
                                        when the run had imported them
``process_files``           str         ``callers``: only the processes that called ``save_state`` added
                                        their random states (DDP, saved by the main process alone)
``models`` ... ``custom``   list        the entries written for each kind of object
``scaler``                  str/null    the fp16 gradient scaler's file
``save_id``                 str         the id of the ``save_state`` call that wrote the folder, the same
                                        on every process and in the header of each safetensors file it
                                        wrote (`accel_train.checkpoint.save_id`)
``files``                   object      every file of the folder but the manifest: relative path (``/``
                                        between folders) -> size in bytes, recorded once every
                                        process's files were written (`accel_train.checkpoint.file_record`)
==========================  ==========  ==================================================================
"""

from __future__ import annotations

import json
from typing import Any

from accel_state.errors import CorruptCheckpointError

__all__ = ["MANIFEST_FIELDS", "manifest_problem", "read_manifest_file"]

#: The manifest's fields and the types they hold (a field may be absent: older or other writers).
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "num_processes": (int,),
    "step": (int, type(None)),
    "safe_serialization": (bool,),
    "strategy": (str,),
    "backend_settings": (dict,),
    "mesh": (dict,),
    "mixed_precision": (str,),
    "gradient_accumulation": (dict,),
    "data": (list,),
    "versions": (dict,),
    "process_files": (str,),
    "models": (list,),
    "optimizers": (list,),
    "schedulers": (list,),
    "dataloaders": (list,),
    "custom": (list,),
    "scaler": (str, type(None)),
    "save_id": (str,),
    "files": (dict,),
}

#: Inside these objects, what each value must be (a size per dimension; a version string per library).
_VALUE_TYPES: dict[str, tuple[type, ...]] = {"mesh": (int,), "versions": (str,), "files": (int,)}


def _is(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def manifest_problem(data: Any) -> str | None:
    """What is wrong with ``data`` as a manifest (the first field that holds the wrong type), or ``None``.

    Args:
        data: the manifest's parsed JSON.
    """
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}"
    for key, types in MANIFEST_FIELDS.items():
        if key in data and not _is(data[key], types):
            return f"{key!r} = {str(data[key])[:80]!r}"
    for key, types in _VALUE_TYPES.items():
        for name, value in data.get(key, {}).items():
            if not _is(value, types):
                return f"{key}[{name!r}] = {str(value)[:80]!r}"
    if isinstance(data.get("num_processes"), int) and data["num_processes"] < 1:
        return f"'num_processes' = {data['num_processes']}"
    if "save_id" in data and not data["save_id"]:
        return "'save_id' = '' (an empty id)"
    for path, size in data.get("files", {}).items():
        if size < 0:
            return f"files[{path!r}] = {size} (a negative size)"
        if not _inside(path):
            return f"files[{path!r}] (not a relative path inside the folder)"
    return None


def _inside(path: str) -> bool:
    """Whether ``path`` is a relative path that stays inside the folder (no ``..``, not absolute)."""
    parts = path.replace("\\", "/").split("/")
    return (
        bool(path) and not path.startswith("/") and ":" not in parts[0] and all(p not in ("", ".", "..") for p in parts)
    )


def read_manifest_file(path: str) -> dict[str, Any]:
    """The manifest ``accel_checkpoint.json`` at ``path``, checked to be a JSON object whose fields hold what
    accel writes there (absent fields are allowed).

    Args:
        path: the manifest file.

    Raises:
        CorruptCheckpointError: the file is not JSON, or not the manifest's structure.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptCheckpointError(
            path, "the checkpoint's manifest in JSON", f"bytes that are not JSON ({err})"
        ) from None
    problem = manifest_problem(data)
    if problem is not None:
        raise CorruptCheckpointError(
            path, "a JSON object with the manifest's fields (format_version, num_processes, step ...)", problem
        )
    return data

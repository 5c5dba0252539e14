"""On which numbers of processes and with which backends a checkpoint folder loads.

Worked out from the folder's entries and its manifest, without reading a tensor or importing torch, by
the rules the readers follow (``accel checkpoint inspect`` prints it):

=============================================  =================  =========================================
state in the folder                            process counts     backends that read it
=============================================  =================  =========================================
full files (``model.safetensors``,             any                single_device, ddp, xla, fsdp (it loads
``optimizer.bin``): single device, DDP,                           full files into the sharded model)
FSDP ``FULL_STATE_DICT``
DCP folders (``pytorch_model_fsdp_{i}/`` with  any: DCP reshards  fsdp (``SHARDED_STATE_DICT``, FSDP1 or
a ``.metadata``): FSDP, ND (TP, HSDP)                             2), nd_parallel
FSDP1 ``LOCAL_STATE_DICT`` (``rank{r}``        the saved count    fsdp (FSDP1, ``LOCAL_STATE_DICT``)
files in ``pytorch_model_fsdp_{i}/``)
DeepSpeed engine tag (``pytorch_model/``)      any: through       deepspeed
                                               DeepSpeed's
                                               universal
                                               checkpoint
pipeline stages (``pytorch_model_pp_{i}/``)    the saved count    pipeline
Megatron-LM (``megatron_model_{i}/``)          the saved count    megatron_lm
=============================================  =================  =========================================

Gradients saved between two optimizer steps of accumulation (``accumulated_grads_{rank}``) are each
process's own: such a checkpoint loads on the saved count only, whatever its backend.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ANY", "where_it_loads"]

#: ``process_counts`` of a checkpoint that loads on any number of processes.
ANY = "any"

_FULL_BACKENDS = ["single_device", "ddp", "xla", "fsdp"]
_SHARDED_MODEL_RE = re.compile(r"^pytorch_model_fsdp(_\d+)?$")
_ENGINE_RE = re.compile(r"^pytorch_model(_\d+)?$")
_PIPELINE_RE = re.compile(r"^pytorch_model_pp(_\d+)?$")
_MEGATRON_RE = re.compile(r"^megatron_model(_\d+)?$")
_FULL_RE = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|pytorch_model_fsdp(_\d+)?\.bin)$")
_LOCAL_SHARD_RE = re.compile(r"^rank\d+\.safetensors$")
_GRADS_RE = re.compile(r"^accumulated_grads_\d+\.safetensors$")

_RESHARD_NOTE = "DCP reshards the model and optimizer to any number of processes (and mesh)"
_DEEPSPEED_NOTE = (
    "on another number of processes the engine's folder is converted with DeepSpeed's ds_to_universal into a "
    "hidden folder beside the checkpoint (its parent folder must be writable)"
)
_RNG_NOTE = "a process whose random states were not saved keeps its own generators (load_state warns)"
_MERGE_NOTE = "`accel merge-weights` turns the model into one full file that every backend reads"


def _dirs(folder: str, names: list[str], pattern: re.Pattern[str]) -> list[str]:
    return [name for name in names if pattern.match(name) and os.path.isdir(os.path.join(folder, name))]


def _kind(folder: str, names: list[str]) -> str:
    """The kind of model state the folder holds (``dcp``, ``local``, ``engine``, ``pipeline``, ``megatron``,
    ``full`` or ``none``), from the names of its entries."""
    for name in _dirs(folder, names, _SHARDED_MODEL_RE):
        inside = os.listdir(os.path.join(folder, name))
        if ".metadata" in inside:
            return "dcp"
        if any(_LOCAL_SHARD_RE.match(entry) for entry in inside):
            return "local"
    if _dirs(folder, names, _ENGINE_RE):
        return "engine"
    if _dirs(folder, names, _PIPELINE_RE):
        return "pipeline"
    if _dirs(folder, names, _MEGATRON_RE):
        return "megatron"
    if any(_FULL_RE.match(name) for name in names):
        return "full"
    return "none"


def where_it_loads(folder: str, manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where the checkpoint ``folder`` loads: ``{"process_counts": "any" or [n], "backends": [...], "notes":
    [...]}`` (``process_counts`` is ``[]`` when the saved count is needed but unknown: no manifest).

    Args:
        folder: the checkpoint folder.
        manifest: its manifest (``None`` when it has none).
    """
    names = sorted(os.listdir(folder))
    saved = (manifest or {}).get("num_processes")
    same: list[int] = [saved] if isinstance(saved, int) else []
    kind = _kind(folder, names)
    notes: list[str] = []
    counts: str | list[int] = ANY
    if kind == "dcp":
        backends = ["fsdp", "nd_parallel"]
        notes += [_RESHARD_NOTE, _MERGE_NOTE]
    elif kind == "local":
        counts, backends = same, ["fsdp"]
        notes.append("FSDP1 LOCAL_STATE_DICT holds each process's flat shards: only the same number of processes")
    elif kind == "engine":
        backends = ["deepspeed"]
        notes += [_DEEPSPEED_NOTE, _MERGE_NOTE]
    elif kind == "pipeline":
        counts, backends = same, ["pipeline"]
        notes.append("each stage reads its parameters by name; another number of processes is not tested")
    elif kind == "megatron":
        counts, backends = same, ["megatron_lm"]
        notes.append("megatron-core's dist_checkpointing reads it; another number of processes is not tested")
    elif kind == "full":
        backends = list(_FULL_BACKENDS)
    else:
        backends = [str((manifest or {}).get("strategy", "single_device"))]
    if any(_GRADS_RE.match(name) for name in names):  # what load_state refuses on another count
        counts = same
        notes.append(
            "saved between two optimizer steps of gradient accumulation: each process's gradients so far are "
            "its own, so only the same number of processes"
        )
    if counts == ANY:
        notes.append(_RNG_NOTE)
    return {"process_counts": counts, "backends": backends, "notes": notes}

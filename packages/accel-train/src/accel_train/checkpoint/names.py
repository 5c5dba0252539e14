"""The names of a checkpoint's files and folders: the documented layout, one table for every strategy.

``FILE_NAMES`` gives the stem of each kind; index 0 is ``stem.suffix``, index i ``stem_i.suffix``. The
regular expressions recognise them in a folder (a previous checkpoint's entries, what a load reads), and
`entry_patterns()` does the same for the entries a strategy declares (`Strategy.checkpoint_entries()`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from accel_state.constants import (
    CUSTOM_CHECKPOINT_PREFIX,
    DATALOADER_NAME,
    FSDP_MODEL_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)

CHECKPOINTS_FOLDER = "checkpoints"
MANIFEST_NAME = "accel_checkpoint.json"

#: Every name a checkpoint folder holds, by kind (the documented layout, one table for every strategy).
#: A value is the stem: index 0 is ``stem.suffix``, index i ``stem_i.suffix`` (folders: ``stem_i``).
FILE_NAMES: dict[str, str] = {
    "model": SAFE_MODEL_NAME,  # model.safetensors
    "model_bin": MODEL_NAME,  # pytorch_model.bin
    "sharded_model": FSDP_MODEL_NAME,  # pytorch_model_fsdp_{i}/ (a torch.distributed.checkpoint folder)
    "optimizer": OPTIMIZER_NAME,  # optimizer.bin, or optimizer_{i}/ when sharded
    "scheduler": SCHEDULER_NAME,
    "dataloader": DATALOADER_NAME,
    "scaler": SCALER_NAME,
    "rng": RNG_STATE_NAME,
    "grads": "accumulated_grads",
    "custom": CUSTOM_CHECKPOINT_PREFIX,
    "manifest": MANIFEST_NAME,
    "engine": MODEL_NAME,  # pytorch_model_{i}/: a DeepSpeed engine's own checkpoint tag
    "engine_optimizer": "deepspeed_optimizer",  # deepspeed_optimizer_{i}.json: its optimizer's marker
}

OWNED_RE = re.compile(
    r"^((model|pytorch_model)(_\d+)?\.(safetensors|bin)|(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin"
    r"|scaler\.pt|random_states_\d+\.(pkl|safetensors)|accumulated_grads_\d+\.safetensors|custom_checkpoint_\d+\.pkl"
    r"|accel_checkpoint\.json"
    r"|pytorch_model_fsdp(_\d+)?(\.bin)?|optimizer_\d+|pytorch_model_fsdp_\d+_rank\d+\.bin)$"
)

#: Regular expressions over folder entries, by kind; the first group that matched is the index.
MODEL_FILE_PATTERN = r"^(?:model(?:_(\d+))?\.safetensors|pytorch_model(?:_(\d+))?\.bin)$"
OPTIMIZER_FILE_PATTERN = r"^optimizer(?:_(\d+))?\.bin$"
SHARDED_MODEL_PATTERN = rf"^{FSDP_MODEL_NAME}(?:_(\d+))?$"
#: an FSDP ``FULL_STATE_DICT`` model as the reference release writes it (a torch file of the full state dict)
FSDP_FULL_MODEL_PATTERN = rf"^{FSDP_MODEL_NAME}(?:_(\d+))?\.bin$"
SHARDED_OPTIMIZER_PATTERN = rf"^{OPTIMIZER_NAME}_(\d+)$"


class CheckpointMismatchError(ValueError):
    """The checkpoint folder does not hold what this Accelerator prepared."""


def indexed(stem: str, index: int, suffix: str) -> str:
    """``stem.suffix`` for index 0, ``stem_{index}.suffix`` after it (the documented naming)."""
    return f"{stem}.{suffix}" if index == 0 else f"{stem}_{index}.{suffix}"


def model_file(index: int, safe_serialization: bool) -> str:
    """``model.safetensors`` / ``pytorch_model.bin`` (``_{index}`` after the first)."""
    if safe_serialization:
        return indexed(FILE_NAMES["model"], index, "safetensors")
    return indexed(FILE_NAMES["model_bin"], index, "bin")


def sharded_model_dir(index: int) -> str:
    """``pytorch_model_fsdp_{index}``: the folder of a model's shards (every index numbered)."""
    return f"{FILE_NAMES['sharded_model']}_{index}"


def sharded_optimizer_dir(index: int) -> str:
    """``optimizer_{index}``: the folder of an optimizer's shards (every index numbered)."""
    return f"{FILE_NAMES['optimizer']}_{index}"


def optimizer_file(index: int) -> str:
    return indexed(FILE_NAMES["optimizer"], index, "bin")


def scheduler_file(index: int) -> str:
    return indexed(FILE_NAMES["scheduler"], index, "bin")


def dataloader_file(index: int) -> str:
    return indexed(FILE_NAMES["dataloader"], index, "bin")


def rng_file(rank: int) -> str:
    return f"{FILE_NAMES['rng']}_{rank}.safetensors"


def grads_file(rank: int) -> str:
    """Gradients accumulated so far, when a checkpoint is taken between two optimizer steps."""
    return f"{FILE_NAMES['grads']}_{rank}.safetensors"


def custom_file(index: int) -> str:
    return f"{FILE_NAMES['custom']}_{index}.pkl"


def entry_patterns(entries: Mapping[str, Any] | None, sharded_only: bool = False) -> list[re.Pattern[str]]:
    """The compiled patterns of a strategy's checkpoint entries (`Strategy.checkpoint_entries()`); with
    ``sharded_only``, of those that are ``torch.distributed.checkpoint`` folders only."""
    chosen = [entry for entry in (entries or {}).values() if entry.sharded or not sharded_only]
    return [re.compile(entry.pattern) for entry in chosen]


def matches_any(entry: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    return any(pattern.match(entry) for pattern in patterns)

"""Sharded saving of a state dict: split by ``max_shard_size`` (pure), then write shards and the index.

The split is pure logic over tensor sizes; :func:`save_sharded` is the only part that touches disk.
Shards are written to a temporary name and renamed into place, and shard files left by an earlier
save into the same folder that the new save does not use are removed, so a folder never mixes two saves.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from accel_bigmodel.sizes import id_tensor_storage, parse_size
from accel_state.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from accel_state.logging import get_logger

logger = get_logger(__name__)

__all__ = ["ShardPlan", "parse_size", "split_state_dict_into_shards", "save_sharded", "find_shared_tensors"]


@dataclass
class ShardPlan:
    """Which tensor goes into which file; ``is_sharded`` is False when everything fits in one file.

    Args:
        filename_to_tensors: Shard file -> names of its tensors.
        tensor_to_filename: Tensor name -> its shard file.
        is_sharded: False when everything fits in one file.
        metadata: Metadata of the index file (for example the total size).
    """

    filename_to_tensors: dict[str, list[str]] = field(default_factory=dict)
    tensor_to_filename: dict[str, str] = field(default_factory=dict)
    is_sharded: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


def _tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def find_shared_tensors(state_dict: dict[str, torch.Tensor]) -> list[list[str]]:
    """Groups (of two or more) of names whose tensors share memory, in state-dict order."""
    groups: dict[Any, list[str]] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            groups.setdefault(id_tensor_storage(tensor), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def split_state_dict_into_shards(
    state_dict: dict[str, torch.Tensor],
    max_shard_size: int | str = "10GB",
    filename_pattern: str = "model{suffix}.safetensors",
) -> ShardPlan:
    """Split ``state_dict`` greedily, in order, into shards of at most ``max_shard_size`` bytes.

    A tensor bigger than the limit gets a shard of its own; tensors sharing memory stay in one shard
    and count once.

    Args:
        state_dict: A state dict (name -> tensor).
        max_shard_size: Largest size of one shard, in bytes or text such as `"5GB"`.
        filename_pattern: File name of a shard, with `{suffix}` where its number goes.
    """
    limit = parse_size(max_shard_size)
    if "{suffix}" not in filename_pattern:
        raise ValueError(f"filename_pattern must contain '{{suffix}}', got {filename_pattern!r}.")
    storage_seen: dict[Any, int] = {}
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    total = 0
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"State dict entry {name!r} is a {type(tensor).__name__}, not a tensor.")
        key = id_tensor_storage(tensor)
        if key in storage_seen:  # an alias goes with the tensor it shares memory with
            shard_index = storage_seen[key]
            (current if shard_index == len(shards) else shards[shard_index]).append(name)
            continue
        size = _tensor_nbytes(tensor)
        total += size
        if current and current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
        storage_seen[key] = len(shards)
    if current or not shards:
        shards.append(current)
    count = len(shards)
    plan = ShardPlan(is_sharded=count > 1, metadata={"total_size": total})
    for index, names in enumerate(shards, start=1):
        suffix = f"-{index:05d}-of-{count:05d}" if count > 1 else ""
        filename = filename_pattern.format(suffix=suffix)
        plan.filename_to_tensors[filename] = names
        for name in names:
            plan.tensor_to_filename[name] = filename
    return plan


def _pattern_for(weights_name: str) -> str:
    stem, dot, ext = weights_name.partition(".")
    return f"{stem}{{suffix}}{dot}{ext}"


def _stale_shard_regex(weights_name: str) -> re.Pattern[str]:
    stem, dot, ext = weights_name.partition(".")
    return re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?{re.escape(dot + ext)}$")


def save_sharded(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
    weights_name: str | None = None,
) -> list[str]:
    """Write ``state_dict`` into ``save_directory`` as one file or as shards plus an index; returns the paths.

    With ``safe_serialization`` names sharing memory are saved once (safetensors refuses aliases): the
    first name keeps the data and the others are listed in the index metadata under ``"shared"``.

    Args:
        state_dict: A state dict (name -> tensor).
        save_directory: The folder to write to (created).
        max_shard_size: Largest size of one shard, in bytes or text such as `"5GB"`.
        safe_serialization: Write safetensors (else `torch.save` files).
        weights_name: File name of the unsharded file; `None` picks the default of the format.
    """
    from safetensors.torch import save_file

    if os.path.isfile(save_directory):
        raise ValueError(f"save_directory {os.fspath(save_directory)!r} is a file; pass a folder.")
    os.makedirs(save_directory, exist_ok=True)
    weights_name = weights_name or (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    shared: dict[str, str] = {}
    if safe_serialization:
        state_dict = dict(state_dict)
        for group in find_shared_tensors(state_dict):
            for alias in group[1:]:
                shared[alias] = group[0]
                del state_dict[alias]
        if shared:
            logger.info(f"Saving tensors that share memory once: {shared} (alias -> saved name).")
    plan = split_state_dict_into_shards(state_dict, max_shard_size, _pattern_for(weights_name))

    stale = _stale_shard_regex(weights_name)
    index_name = f"{weights_name}.index.json"
    for existing in os.listdir(save_directory):
        if stale.match(existing) and existing not in plan.filename_to_tensors:
            os.remove(os.path.join(save_directory, existing))
    if not plan.is_sharded and os.path.isfile(os.path.join(save_directory, index_name)):
        os.remove(os.path.join(save_directory, index_name))

    written = []
    for filename, names in plan.filename_to_tensors.items():
        shard = {name: state_dict[name] for name in names}
        path = os.path.join(save_directory, filename)
        tmp = path + ".tmp"
        if safe_serialization:
            shard = {k: v.detach().contiguous() for k, v in shard.items()}
            save_file(shard, tmp, metadata={"format": "pt"})
        else:
            torch.save(shard, tmp)
        os.replace(tmp, path)
        written.append(path)
    if plan.is_sharded:
        metadata: dict[str, Any] = dict(plan.metadata)
        if shared:
            metadata["shared"] = shared
        index = {"metadata": metadata, "weight_map": dict(sorted(plan.tensor_to_filename.items()))}
        path = os.path.join(save_directory, index_name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(path + ".tmp", path)
        written.append(path)
    return written

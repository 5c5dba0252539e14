"""Sharded saving of a state dict: split by ``max_shard_size`` (pure), then write shards and the index.

The split is pure logic over tensor sizes; `save_sharded()` is the only part that touches disk.
Shards are written under hidden names and brought into place behind the index, which is the commit
point; shard files of an earlier save that the new index does not name are removed after it, so a
folder never mixes two saves, even when the writer is killed.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from accel_bigmodel.integrity import torch_file_id
from accel_bigmodel.safe_write import (
    link_over,
    remove_leftovers,
    replace,
    tmp_name,
    write_bytes,
    write_error,
    write_safetensors,
    write_torch,
)
from accel_bigmodel.sizes import id_tensor_storage, parse_size
from accel_state.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from accel_state.logging import get_logger

logger = get_logger(__name__)

# keys of the index metadata (beside the documented "total_size"); readers of the documented layout
# ignore them, ours check them
SAVE_ID_KEY = "accel_save_id"
FILE_SIZES_KEY = "accel_file_sizes"
#: ``torch.save`` shards cannot carry the save id without a change to their pickle, so the index records each
#: one's identity instead (`accel_bigmodel.integrity.torch_file_id()`: its zip records' names, CRC-32, sizes)
FILE_IDS_KEY = "accel_file_ids"

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

    The write is atomic for a reader: killed at any moment, the folder loads as the previous save or
    as this one, never a mix. Shards are written under hidden names first; the index is the commit
    point (when new shards would replace old ones of the same name, an intermediate index naming the
    hidden files is committed first, then the shards are linked into place); shards the new index no
    longer names are removed only after it is in place. The index records each file's size and a save
    id (also in each safetensors shard's metadata; for ``torch.save`` shards the index records each file's
    identity instead, ``accel_file_ids``), so a reader refuses a folder whose files are not the ones the
    index was written with.

    Args:
        state_dict: A state dict (name -> tensor).
        save_directory: The folder to write to (created).
        max_shard_size: Largest size of one shard, in bytes or text such as `"5GB"`.
        safe_serialization: Write safetensors (else `torch.save` files).
        weights_name: File name of the unsharded file; `None` picks the default of the format.

    Raises:
        CheckpointWriteError: a file could not be written (disk full, permission denied, ...): the
            message names the path and the OS reason; partial files are removed and the previous save
            is intact.
    """
    folder = os.fspath(save_directory)
    if os.path.isfile(folder):
        raise ValueError(f"save_directory {folder!r} is a file; pass a folder.")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise write_error(folder, err, "checkpoint folder") from None
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
    index_name = f"{weights_name}.index.json"
    index_path = os.path.join(folder, index_name)
    remove_leftovers(folder, keep=_named_by_index(index_path))

    token = uuid.uuid4().hex
    hidden: dict[str, str] = {}
    sizes: dict[str, int] = {}
    ids: dict[str, str] = {}  # torch.save shards: their identity (safetensors ones hold the save id)
    try:
        for filename, names in plan.filename_to_tensors.items():
            shard = {name: state_dict[name] for name in names}
            hidden[filename] = tmp_name(folder, filename, token[:12])
            if safe_serialization:
                sizes[filename] = write_safetensors(hidden[filename], shard, {"format": "pt", SAVE_ID_KEY: token})
            else:
                sizes[filename] = write_torch(hidden[filename], shard)
                file_id = torch_file_id(hidden[filename])
                if file_id is not None:
                    ids[filename] = file_id
    except BaseException:
        for path in hidden.values():
            _remove(path)
        raise

    final = {filename: os.path.join(folder, filename) for filename in plan.filename_to_tensors}
    if not plan.is_sharded:
        (filename,) = final
        replace(hidden[filename], final[filename])  # the commit (an old index, if any, still wins until removed)
        _remove(index_path)
    else:
        metadata: dict[str, Any] = dict(plan.metadata)
        if shared:
            metadata["shared"] = shared
        metadata[SAVE_ID_KEY] = token

        def write_index(names: dict[str, str]) -> None:
            metadata[FILE_SIZES_KEY] = {names[f]: size for f, size in sorted(sizes.items())}
            if ids:
                metadata[FILE_IDS_KEY] = {names[f]: file_id for f, file_id in sorted(ids.items())}
            index = {
                "metadata": metadata,
                "weight_map": {k: names[f] for k, f in sorted(plan.tensor_to_filename.items())},
            }
            text = json.dumps(index, indent=2, sort_keys=True) + "\n"
            staged = tmp_name(folder, index_name)
            write_bytes(staged, text.encode(), "checkpoint index")
            replace(staged, index_path)

        collide = [f for f in final if os.path.lexists(final[f])]
        try:
            if collide:  # commit the new save under its hidden names, then bring the shards into place
                write_index({f: os.path.basename(p) for f, p in hidden.items()})
                for filename in final:
                    link_over(hidden[filename], final[filename])
            else:
                for filename in final:
                    replace(hidden[filename], final[filename])
            write_index({f: f for f in final})  # the commit
        except BaseException:
            if not collide:
                for filename in final:
                    _remove(hidden[filename])
                    _remove(final[filename])
            raise
        for path in hidden.values():
            _remove(path)

    stale = _stale_shard_regex(weights_name)
    for existing in os.listdir(folder):
        if stale.match(existing) and existing not in plan.filename_to_tensors:
            _remove(os.path.join(folder, existing))
    remove_leftovers(folder, keep=set())  # hidden files of interrupted saves: no index names them now
    written = list(final.values())
    if plan.is_sharded:
        written.append(index_path)
    return written


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _named_by_index(index_path: str) -> set[str]:
    """File names the index at ``index_path`` refers to (empty when there is none or it is unreadable)."""
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        return {v for v in weight_map.values() if isinstance(v, str)}
    except (OSError, ValueError, AttributeError):
        return set()

"""Find and read checkpoint files: one file, a folder, or a sharded index (safetensors or ``.bin``).

``.bin`` files are read with ``torch.load(weights_only=True)`` (memory-mapped when possible), so a
checkpoint never runs pickled code. Damaged files raise `CorruptCheckpointError`
(a `CheckpointError`) naming the file, what was expected and what was found; a well-formed
``.bin`` whose pickle asks for code raises `UnsafeCheckpointError`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

from accel_bigmodel.confine import allowed_root, check_confined
from accel_bigmodel.integrity import damaged_torch_file, torch_file_id
from accel_bigmodel.sharding import FILE_IDS_KEY, FILE_SIZES_KEY, SAVE_ID_KEY
from accel_bigmodel.tensor_io import CheckpointError, TensorLocation, check_safetensors_file, read_safetensors_header
from accel_state.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class CheckpointFiles:
    """The files of a checkpoint and, for each tensor name, which file holds it."""

    files: list[str]
    key_to_file: dict[str, str] | None = None  # known from an index without opening files
    shared: dict[str, str] = field(default_factory=dict)  # alias -> saved name (from our index metadata)


def _inside(folder_file: str, name: str, entry: str) -> str:
    """``name`` (an index entry) as a path inside the index's folder; an absolute or ``..`` entry is refused."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts:
        raise UnsafeCheckpointError(
            folder_file,
            f"the entry {entry!r} -> {name!r}, a path outside the index's folder",
            "Index entries must be file names relative to the folder that holds the index.",
        )
    return os.path.join(os.path.dirname(folder_file), name)


def _confined(file: str, folder: str) -> str:
    """``file`` of the checkpoint folder ``folder``, refused when it is a link out of it (`check_confined()`)."""
    check_confined(file, folder)
    return file


def _check_recorded(path: str, metadata: dict[str, Any], files: list[str]) -> None:
    """Refuse files that are not the ones the index was written with (sizes and save id it recorded)."""
    sizes = metadata.get(FILE_SIZES_KEY)
    save_id = metadata.get(SAVE_ID_KEY)
    file_ids = metadata.get(FILE_IDS_KEY)
    folder = os.path.dirname(path)
    for file in files:
        name = os.path.relpath(file, folder)
        if isinstance(sizes, dict) and name in sizes:
            actual = os.path.getsize(file)
            if actual != sizes[name]:
                damage = _damage(file)  # a damaged file (cut short, bytes added); a whole one is from another save
                if damage is not None:
                    raise CorruptCheckpointError(
                        file,
                        f"{sizes[name]} bytes: the index {path!r} records {sizes[name]}",
                        f"{actual} bytes, and its own header expects {damage.expected}",
                    )
                raise CheckpointError(
                    f"Checkpoint file {file!r} has {actual} bytes but the index {path!r} records {sizes[name]}: "
                    "the folder mixes two saves or the file was changed; save the checkpoint again."
                )
        recorded = file_ids.get(name) if isinstance(file_ids, dict) else None
        if isinstance(recorded, str) and not is_safetensors(file) and torch_file_id(file) != recorded:
            damage = _damage(file)
            if damage is not None:
                raise damage
            raise CheckpointError(
                f"Checkpoint file {file!r} was not written by the save that wrote the index {path!r} "
                "(its records differ from those the index recorded): the folder mixes two saves; save the "
                "checkpoint again."
            )
        if isinstance(save_id, str) and is_safetensors(file):
            with open(file, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8) or b"\0" * 8)
                header = f.read(min(length, 1 << 30))
            if save_id.encode() not in header:
                raise CheckpointError(
                    f"Checkpoint file {file!r} was not written by the save that wrote the index {path!r} "
                    "(its save id differs): the folder mixes two saves; save the checkpoint again."
                )


def _damage(path: str) -> CorruptCheckpointError | None:
    """The error for the weights file ``path`` when it is damaged (its headers read only), else ``None``."""
    if not is_safetensors(path):
        return damaged_torch_file(path)
    try:
        check_safetensors_file(path)
    except CorruptCheckpointError as damage:
        return damage
    return None


def _read_index(path: str) -> CheckpointFiles:
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptCheckpointError(path, "an index file in JSON", f"bytes that are not JSON ({err})") from None
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(
            path,
            "an index with a 'weight_map' of tensor name -> file name",
            f"a JSON {type(index).__name__} without one",
        )
    resolved: dict[str, str] = {}  # each shard name is checked and joined once, not once per tensor
    key_to_file: dict[str, str] = {}
    for key, name in weight_map.items():
        file = resolved.get(name)
        if file is None:
            file = resolved[name] = _inside(path, name, key)
        key_to_file[key] = file
    files = list(dict.fromkeys(resolved.values()))
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise CheckpointError(f"Index file {path!r} lists shard files that do not exist: {missing}.")
    folder = os.path.dirname(path) or "."
    root = allowed_root(folder)
    for file in files:  # a shard may be a link: it must resolve inside the folder (or the hub cache's blobs)
        check_confined(file, folder, refused=path, root=root)
    metadata = (index.get("metadata") or {}) if "weight_map" in index else {}
    if isinstance(metadata, dict):
        _check_recorded(path, metadata, files)
    shared = metadata.get("shared", {}) if isinstance(metadata, dict) else {}
    return CheckpointFiles(files, key_to_file, dict(shared) if isinstance(shared, dict) else {})


def resolve_checkpoint(checkpoint: str | os.PathLike[str]) -> CheckpointFiles:
    """Which files make up ``checkpoint`` (a weights file, an index ``.json`` or a folder holding either)."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        if path.endswith(".json"):
            return _read_index(path)
        return CheckpointFiles([path])
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Checkpoint {path!r} is neither a file nor a folder.")
    for index_name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME):
        if os.path.isfile(os.path.join(path, index_name)):
            return _read_index(_confined(os.path.join(path, index_name), path))
    for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if os.path.isfile(os.path.join(path, name)):
            return CheckpointFiles([_confined(os.path.join(path, name), path)])
    entries = sorted(os.listdir(path))
    indexes = [e for e in entries if e.endswith(".index.json")] or [e for e in entries if e == "index.json"]
    if len(indexes) == 1:
        return _read_index(_confined(os.path.join(path, indexes[0]), path))
    weights = [e for e in entries if e.endswith(_WEIGHT_SUFFIXES)]
    if len(weights) == 1:
        return CheckpointFiles([_confined(os.path.join(path, weights[0]), path)])
    raise ValueError(
        f"Folder {path!r} is not a checkpoint: expected {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME}, one '*.index.json' "
        f"file, or a single weights file; it holds {entries[:20]}."
    )


def is_safetensors(path: str) -> bool:
    return path.endswith(".safetensors")


_UNSAFE_HINT = (
    "Only tensors and plain containers are read from .bin files (torch.load(weights_only=True)); nothing "
    "was executed. Re-save the weights as safetensors from a trusted copy."
)


def refused_pickle_content(err: BaseException) -> str:
    """What torch's weights-only unpickler refused, from its message: a global, an opcode, ..."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
    if found:
        return f"a pickled reference to {found.group(1)!r}, which loading would call"
    opcode = re.search(r"Unsupported operand (\d+)", text)
    if opcode:
        return f"pickle opcode {opcode.group(1)}, which the weights-only unpickler does not read"
    lines = [line for line in text.splitlines() if line.strip() and "Weights only load failed" not in line]
    return f"content the weights-only unpickler refuses ({lines[0][:200] if lines else 'unknown'})"


def load_bin(path: str) -> dict[str, torch.Tensor]:
    """Tensors of a ``torch.save`` file, without unpickling arbitrary objects (memory-mapped when possible)."""
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err) and "zip" not in str(err):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        damaged = damaged_torch_file(path)  # zip cut short, CRC mismatch, garbled pickle
        if damaged is not None:
            raise damaged from None
        if isinstance(err, pickle.UnpicklingError):  # a well-formed pickle the restricted unpickler refused
            raise UnsafeCheckpointError(path, refused_pickle_content(err), _UNSAFE_HINT) from None
        raise CheckpointError(
            f"Cannot read checkpoint file {path!r} (truncated, corrupt, or holding more than tensors): {err}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"Checkpoint file {path!r} holds a {type(state).__name__}, not a state dict.")
    return state


def check_safetensors_format(path: str, metadata: dict[str, str]) -> None:
    fmt = metadata.get("format", "pt")
    if fmt not in ("pt", "np", "mlx"):
        raise CheckpointError(f"Checkpoint file {path!r} was saved by the {fmt!r} framework; re-save it from PyTorch.")


def describe(files: list[str]) -> tuple[dict[str, tuple[tuple[int, ...], torch.dtype]], dict[str, Any]]:
    """Shape and dtype of every tensor in ``files`` (headers only for safetensors; lazy load for ``.bin``).

    Returns (name -> (shape, dtype), per-file handle: safetensors header locations or the ``.bin`` dict).
    """
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    opened: dict[str, Any] = {}
    for path in files:
        if is_safetensors(path):
            locations, metadata = read_safetensors_header(path)
            check_safetensors_format(path, metadata)
            opened[path] = locations
            for name, loc in locations.items():
                shapes[name] = (loc.shape, loc.dtype)
        else:
            state = load_bin(path)
            opened[path] = state
            for name, tensor in state.items():
                if isinstance(tensor, torch.Tensor):
                    shapes[name] = (tuple(tensor.shape), tensor.dtype)
    return shapes, opened


def load_state_dict(
    checkpoint_file: str | os.PathLike[str], device_map: dict[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """The state dict in one checkpoint file, on CPU (or on the devices ``device_map`` gives; disk stays on CPU).

    Args:
        checkpoint_file: A `.safetensors` or `.bin` file.
        device_map: Where each weight goes; `None` loads all on the CPU.
    """
    path = os.fspath(checkpoint_file)
    if not is_safetensors(path):
        return load_bin(path)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _, metadata = check_safetensors_file(path)
    check_safetensors_format(path, metadata)
    try:
        state = load_file(path, device="cpu")
    except SafetensorError as err:
        raise CorruptCheckpointError(
            path, "a safetensors file", f"one the safetensors library refuses ({err})"
        ) from None
    if device_map is None:
        return state
    from accel_bigmodel.planning import device_for

    for name, tensor in state.items():
        device = device_for(name, device_map)
        if device not in (None, "cpu", "disk"):
            state[name] = tensor.to(device)
    return state


def location_of(opened: dict[str, Any], path: str, name: str) -> TensorLocation | None:
    entry = opened.get(path)
    if isinstance(entry, dict) and name in entry and isinstance(entry[name], TensorLocation):
        return entry[name]
    return None

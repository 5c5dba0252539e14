"""Find and read checkpoint files: one file, a folder, or a sharded index (safetensors or ``.bin``).

``.bin`` files are read with ``torch.load(weights_only=True)`` (memory-mapped when possible), so a
checkpoint never runs pickled code. Damaged files raise :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from accel_bigmodel.tensor_io import CheckpointError, TensorLocation, read_safetensors_header
from accel_state.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class CheckpointFiles:
    """The files of a checkpoint and, for each tensor name, which file holds it."""

    files: list[str]
    key_to_file: dict[str, str] | None = None  # known from an index without opening files
    shared: dict[str, str] = field(default_factory=dict)  # alias -> saved name (from our index metadata)


def _read_index(path: str) -> CheckpointFiles:
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"Index file {path!r} is not valid JSON: {err}.") from None
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"Index file {path!r} has no 'weight_map' of tensor name -> file name.")
    folder = os.path.dirname(path)
    key_to_file = {key: os.path.join(folder, name) for key, name in weight_map.items()}
    files = list(dict.fromkeys(key_to_file.values()))
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise CheckpointError(f"Index file {path!r} lists shard files that do not exist: {missing}.")
    shared = (index.get("metadata") or {}).get("shared", {}) if "weight_map" in index else {}
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
            return _read_index(os.path.join(path, index_name))
    for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if os.path.isfile(os.path.join(path, name)):
            return CheckpointFiles([os.path.join(path, name)])
    entries = sorted(os.listdir(path))
    indexes = [e for e in entries if e.endswith(".index.json")] or [e for e in entries if e == "index.json"]
    if len(indexes) == 1:
        return _read_index(os.path.join(path, indexes[0]))
    weights = [e for e in entries if e.endswith(_WEIGHT_SUFFIXES)]
    if len(weights) == 1:
        return CheckpointFiles([os.path.join(path, weights[0])])
    raise ValueError(
        f"Folder {path!r} is not a checkpoint: expected {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME}, one '*.index.json' "
        f"file, or a single weights file; it holds {entries[:20]}."
    )


def is_safetensors(path: str) -> bool:
    return path.endswith(".safetensors")


def load_bin(path: str) -> dict[str, torch.Tensor]:
    """Tensors of a ``torch.save`` file, without unpickling arbitrary objects (memory-mapped when possible)."""
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err) and "zip" not in str(err):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle refuses, zip is truncated, ...
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

    _, metadata = read_safetensors_header(path)
    check_safetensors_format(path, metadata)
    try:
        state = load_file(path, device="cpu")
    except SafetensorError as err:
        raise CheckpointError(f"Cannot read checkpoint file {path!r}: {err}.") from None
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

"""Weights kept off the execution device: on disk (one file each, or in place in a safetensors file) or in RAM.

The offload folder holds ``index.json`` (name -> dtype and shape, or the safetensors file and tensor
name to read from) and one ``<name>.dat`` file of raw bytes per tensor written here. Weights that are
already in a safetensors checkpoint are never copied: the index points at them.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.tensor_io import (
    MAP_THRESHOLD,
    CheckpointError,
    FileHandles,
    TensorLocation,
    dtype_from_name,
    dtype_name,
    map_tensor,
    read_safetensors_header,
    read_tensor,
    write_tensor,
)

INDEX_NAME = "index.json"


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str], index: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat`` and record it in ``index`` (returned).

    Args:
        weight: The tensor to write.
        weight_name: Its name (the file is `<weight_name>.dat`).
        offload_folder: The folder to write to.
        index: The index to add it to; `None` starts a new one.
    """
    os.makedirs(offload_folder, exist_ok=True)
    write_tensor(os.path.join(offload_folder, f"{weight_name}.dat"), weight)
    if index is None:
        index = {}
    index[weight_name] = {"dtype": dtype_name(weight.dtype), "shape": list(weight.shape)}
    return index


def load_offloaded_weight(weight_file: str, weight_info: Mapping[str, Any]) -> torch.Tensor:
    """Read one ``.dat`` file described by ``weight_info`` ({"dtype", "shape"}) into a CPU tensor.

    Args:
        weight_file: The `.dat` file.
        weight_info: Its entry of the offload index (`dtype`, `shape`).
    """
    location = TensorLocation(weight_file, 0, dtype_from_name(weight_info["dtype"]), tuple(weight_info["shape"]))
    size = os.path.getsize(weight_file)
    if size < location.nbytes:
        raise CheckpointError(
            f"Offloaded weight file {weight_file!r} is truncated: {size} bytes, expected {location.nbytes}."
        )
    fd = os.open(weight_file, os.O_RDONLY)
    try:
        return read_tensor(fd, location)
    finally:
        os.close(fd)


def save_offload_index(index: Mapping[str, Any], offload_folder: str | os.PathLike[str]) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json``.

    Args:
        index: The offload index: weight name -> its `dtype` and `shape`.
        offload_folder: The folder holding `index.json`.
    """
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_NAME)
    current: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    current.update(index)
    os.makedirs(offload_folder, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(current, f, indent=2)
    os.replace(path + ".tmp", path)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Write every tensor of ``state_dict`` into one safetensors file in ``save_dir`` and index it; returns the index.

    One file (not one per tensor) keeps the writes fast and lets the prefetcher read many small
    weights with one system call. Tensors sharing memory are written once.

    Args:
        save_dir: The folder to write to.
        state_dict: A state dict (name -> tensor).
    """
    from safetensors.torch import save_file

    from accel_bigmodel.sizes import id_tensor_storage

    os.makedirs(save_dir, exist_ok=True)
    if not state_dict:
        return {}
    # an absolute path, as other readers of offload indexes expect
    path = os.path.abspath(os.path.join(save_dir, f"offload-{uuid.uuid4().hex[:12]}.safetensors"))
    to_save: dict[str, torch.Tensor] = {}
    saved_as: dict[Any, str] = {}
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        key = id_tensor_storage(tensor) + (tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key not in saved_as:
            saved_as[key] = name
            to_save[name] = tensor.detach().to("cpu").contiguous()
        index[name] = {"safetensors_file": path, "weight_name": saved_as[key], "dtype": dtype_name(tensor.dtype)}
    save_file(to_save, path, metadata={"format": "pt"})
    save_offload_index(index, save_dir)
    return index


def load_offload_index(offload_folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = os.path.join(offload_folder, INDEX_NAME)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class PrefixedDataset(Mapping[str, Any]):
    """View of ``dataset`` under ``prefix``: ``view["weight"]`` is ``dataset[prefix + "weight"]``.

    Args:
        dataset: The mapping name -> tensor to view.
        prefix: The prefix added to every key.
    """

    def __init__(self, dataset: Mapping[str, Any], prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return iter([key[n:] for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for key in self.dataset if key.startswith(self.prefix))

    @property
    def supports_zero_copy(self) -> bool:
        """True when the underlying mapping can hand out memory-mapped tensors."""
        return bool(getattr(self.dataset, "supports_zero_copy", False))

    def read(self, key: str, zero_copy: bool = False) -> Any:
        """The CPU tensor for ``key`` (without the move to the dataset's device).

        Args:
            key: Name of the weight.
            zero_copy: Map big tensors from their file instead of copying them into memory.
        """
        reader = getattr(self.dataset, "read", None)
        full = f"{self.prefix}{key}"
        if reader is None:
            return self.dataset[full]
        return reader(full, zero_copy=zero_copy) if self.supports_zero_copy else reader(full)

    def location(self, key: str) -> Any:
        """Where ``key`` lives, when the underlying dataset knows (see OffloadedWeightsLoader.location).

        Args:
            key: Name of the weight.
        """
        finder = getattr(self.dataset, "location", None)
        return finder(f"{self.prefix}{key}") if finder else None


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """Read-only mapping name -> tensor over RAM weights (``state_dict``) and disk weights (``index``).

    Disk weights come from ``save_folder`` (its ``index.json``) and/or ``index``; they are read when
    asked for, into a new tensor, and moved to ``device`` if given.

    Args:
        state_dict: Weights held in memory.
        save_folder: Folder of the weights on disk.
        index: The offload index of the weights on disk; `None` reads `save_folder/index.json`.
        device: Device the weights are returned on; `None` keeps the CPU.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Any] | None = None,
        device: Any = None,
    ):
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index.")
        self.state_dict = dict(state_dict or {})
        self.save_folder = os.fspath(save_folder) if save_folder is not None else None
        self.index: dict[str, Any] = {}
        if self.save_folder is not None:
            self.index.update(load_offload_index(self.save_folder))
        if index is not None:
            self.index.update(index)
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self.device = device
        self._handles = FileHandles()
        self._headers: dict[str, dict[str, TensorLocation]] = {}
        self._lock = threading.Lock()

    def location(self, key: str) -> tuple[TensorLocation, torch.dtype] | None:
        """(where the bytes are, dtype wanted) for a disk weight; None for a weight held in RAM.

        Args:
            key: Name of the weight.
        """
        if key in self.state_dict:
            return None
        info = self.index[key]
        if "safetensors_file" in info:
            path = self._safetensors_path(info["safetensors_file"])
            with self._lock:
                header = self._headers.get(path)
                if header is None:
                    header = self._headers[path] = read_safetensors_header(path)[0]
            location = header[info.get("weight_name", key)]
            wanted = dtype_from_name(info["dtype"]) if "dtype" in info else location.dtype
            return location, wanted
        if self.save_folder is None:
            raise KeyError(f"Weight {key!r} is on disk but no save_folder was given to find {key}.dat.")
        dtype = dtype_from_name(info["dtype"])
        path = os.path.join(self.save_folder, f"{key}.dat")
        return TensorLocation(path, 0, dtype, tuple(info["shape"])), dtype

    def _safetensors_path(self, path: str) -> str:
        """Where an index's ``safetensors_file`` is: as written (absolute, or relative to the working
        directory, as other writers of offload indexes mean it), else inside the offload folder."""
        if os.path.isabs(path) or os.path.exists(path) or self.save_folder is None:
            return path
        inside = os.path.join(self.save_folder, path)
        return inside if os.path.exists(inside) else path

    supports_zero_copy = True

    def read(self, key: str, zero_copy: bool = False) -> torch.Tensor:
        """The tensor for ``key`` on CPU (read from disk when offloaded), in its wanted dtype.

        With ``zero_copy`` big tensors are memory-mapped instead of copied (for CPU execution).

        Args:
            key: Name of the weight.
            zero_copy: Map big tensors from their file instead of copying them into memory.
        """
        found = self.location(key)
        if found is None:
            return self.state_dict[key]
        location, wanted = found
        if zero_copy and location.nbytes >= MAP_THRESHOLD:
            tensor = map_tensor(location)
            return tensor if tensor.dtype == wanted else tensor.to(wanted)
        with self._lock:
            fd = self._handles.get(location.path)
        tensor = read_tensor(fd, location)
        return tensor if tensor.dtype == wanted else tensor.to(wanted)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.state_dict and key not in self.index:
            raise KeyError(key)
        tensor = self.read(key)
        return tensor.to(self.device) if self.device is not None else tensor

    def __contains__(self, key: object) -> bool:
        return key in self.state_dict or key in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """Entries of ``state_dict`` that belong to one of ``submodule_names`` (or are one of them).

    Args:
        state_dict: A state dict (name -> tensor).
        submodule_names: Names of the submodules whose entries are kept.
    """
    wanted = set(submodule_names)
    if "" in wanted:
        return dict(state_dict)
    result = {}
    for key, value in state_dict.items():
        probe = key
        while True:
            if probe in wanted:
                result[key] = value
                break
            if "." not in probe:
                break
            probe = probe.rpartition(".")[0]
    return result


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Any], offload_folder: str | os.PathLike[str]) -> None:
    """Load every weight listed in ``index`` from ``offload_folder`` into ``model`` on the CPU.

    Args:
        model: The model (an `nn.Module`).
        index: The offload index: weight name -> its `dtype` and `shape`.
        offload_folder: The folder the index points into.
    """
    from accel_bigmodel.tensors import set_module_tensor_to_device

    if not index:
        return
    loader = OffloadedWeightsLoader(save_folder=offload_folder, index=index)
    for name in index:
        set_module_tensor_to_device(model, name, "cpu", value=loader.read(name))

"""Weights kept off the execution device: on disk (one file each, or in place in a safetensors file) or in RAM.

The offload folder holds ``index.json`` (name -> dtype and shape, or the safetensors file and tensor
name to read from) and one ``<name>.dat`` file of raw bytes per tensor written here. Weights that are
already in a safetensors checkpoint are never copied: the index points at them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.confine import allowed_root, check_confined
from accel_bigmodel.safe_write import (
    replace,
    tmp_name,
    write_bytes,
    write_error,
    write_raw_tensor,
    write_safetensors,
)
from accel_bigmodel.tensor_io import (
    MAP_THRESHOLD,
    FileHandles,
    TensorLocation,
    dtype_from_name,
    dtype_name,
    map_tensor,
    read_safetensors_header,
    read_tensor,
)
from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError

INDEX_NAME = "index.json"


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str], index: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat`` and record it in ``index`` (returned).

    The file is written under a hidden name and renamed into place, so an interrupted write never
    leaves a short ``.dat`` file under the real name.

    Args:
        weight: The tensor to write.
        weight_name: Its name (the file is `<weight_name>.dat`).
        offload_folder: The folder to write to.
        index: The index to add it to; `None` starts a new one.

    Raises:
        ValueError: ``weight_name`` would put the file outside ``offload_folder`` (absolute, ``..``).
        CheckpointWriteError: the OS refused the write (path and reason in the message).
    """
    folder = os.fspath(offload_folder)
    path = dat_path(folder, weight_name, None)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise write_error(folder, err, "offload folder") from None
    staged = tmp_name(folder, os.path.basename(path))
    write_raw_tensor(staged, weight)
    replace(staged, path)
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
    if size != location.nbytes:
        raise CorruptCheckpointError(
            weight_file,
            f"{location.nbytes} bytes: its index records {location.nbytes} "
            f"(dtype {weight_info['dtype']}, shape {list(weight_info['shape'])})",
            f"{size} bytes (cut short, or from another save)",
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
    folder = os.fspath(offload_folder)
    path = os.path.join(folder, INDEX_NAME)
    current: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    current.update(index)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise write_error(folder, err, "offload folder") from None
    staged = tmp_name(folder, INDEX_NAME)
    write_bytes(staged, json.dumps(current, indent=2).encode(), "offload index")
    replace(staged, path)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Write every tensor of ``state_dict`` into one safetensors file in ``save_dir`` and index it; returns the index.

    One file (not one per tensor) keeps the writes fast and lets the prefetcher read many small
    weights with one system call. Tensors sharing memory are written once.

    Args:
        save_dir: The folder to write to.
        state_dict: A state dict (name -> tensor).
    """
    from accel_bigmodel.sizes import id_tensor_storage

    folder = os.fspath(save_dir)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise write_error(folder, err, "offload folder") from None
    if not state_dict:
        return {}
    # a name inside the folder: the index must not point out of it
    name = f"offload-{uuid.uuid4().hex[:12]}.safetensors"
    path = os.path.join(folder, name)
    to_save: dict[str, torch.Tensor] = {}
    saved_as: dict[Any, str] = {}
    index: dict[str, Any] = {}
    for tensor_name, tensor in state_dict.items():
        key = id_tensor_storage(tensor) + (tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key not in saved_as:
            saved_as[key] = tensor_name
            to_save[tensor_name] = tensor.detach().to("cpu").contiguous()
        index[tensor_name] = {"safetensors_file": name, "weight_name": saved_as[key], "dtype": dtype_name(tensor.dtype)}
    staged = tmp_name(folder, name)
    write_safetensors(staged, to_save, {"format": "pt"})
    replace(staged, path)  # a new name: an earlier index never points at a half-written file
    try:
        save_offload_index(index, folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    return index


def load_offload_index(offload_folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The index of an offload folder (empty when there is none), every entry checked to stay in the folder.

    An entry's ``safetensors_file`` must be a relative path without ``..`` (resolved in the folder, or
    in the working directory as the documented system's writer means a relative checkpoint path).

    Raises:
        UnsafeCheckpointError: an entry names a file outside the folder (absolute path or ``..``).
        CorruptCheckpointError: the index is not JSON, or not a JSON object of entries (a
            `CheckpointError`).
    """
    path = os.path.join(offload_folder, INDEX_NAME)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except ValueError as err:
        raise CorruptCheckpointError(path, "an offload index in JSON", f"bytes that are not JSON ({err})") from None
    if not isinstance(index, dict) or not all(isinstance(v, dict) for v in index.values()):
        raise CorruptCheckpointError(
            path, "a JSON object of weight name -> entry (an object)", f"a JSON {type(index).__name__} of other values"
        )
    folder = os.fspath(offload_folder)
    root = allowed_root(folder)
    checked: set[str] = set()  # many entries share one safetensors file: check each file once
    for key, info in index.items():
        if "safetensors_file" in info:
            name = str(info["safetensors_file"])
            if name in checked:
                continue
            checked.add(name)
            named = _inside(path, name, key)
        else:
            named = dat_path(folder, key, path)
        if os.path.lexists(named):  # a link must resolve inside the folder (a missing file is named on read)
            check_confined(named, folder, refused=path, root=root)
    return index


def _inside(index_path: str, name: str, entry: str) -> str:
    """``name`` resolved inside the index's folder; an absolute or ``..`` name is refused."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts:
        raise UnsafeCheckpointError(
            index_path,
            f"the entry {entry!r} -> {name!r}, a path outside the offload folder",
            "Offload index entries must name files inside the folder that holds the index.",
        )
    return os.path.join(os.path.dirname(index_path), name)


def dat_path(folder: str, weight_name: str, index_path: str | None) -> str:
    """``<folder>/<weight_name>.dat``, refusing a weight name that would leave ``folder``."""
    parts = weight_name.replace("\\", "/").split("/")
    if not weight_name or os.path.isabs(weight_name) or weight_name.startswith(("/", "\\")) or ".." in parts:
        if index_path is not None:
            raise UnsafeCheckpointError(
                index_path,
                f"the weight name {weight_name!r}, whose file would be outside the offload folder",
                "Offloaded weight names must be plain names (no absolute path, no '..').",
            )
        raise ValueError(
            f"Cannot offload a weight named {weight_name!r}: its file would be outside the offload folder "
            f"{folder!r}; use a plain name (no absolute path, no '..')."
        )
    return os.path.join(folder, f"{weight_name}.dat")


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
        self._from_file: set[str] = set()  # entries read from index.json: their paths must stay in the folder
        if self.save_folder is not None:
            on_disk = load_offload_index(self.save_folder)
            self.index.update(on_disk)
            self._from_file.update(on_disk)
        if index is not None:
            self.index.update(index)
            self._from_file.difference_update(index)
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
            name = info["safetensors_file"]
            inside = os.path.join(str(self.save_folder), name) if key in self._from_file else None
            # entries of index.json were checked on read (relative, no '..'): inside the folder first
            path = inside if inside is not None and os.path.exists(inside) else self._safetensors_path(name)
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
        path = dat_path(self.save_folder, key, os.path.join(self.save_folder, INDEX_NAME))
        location = TensorLocation(path, 0, dtype, tuple(info["shape"]))
        size = os.path.getsize(path)
        if size != location.nbytes:
            raise CorruptCheckpointError(
                path,
                f"{location.nbytes} bytes: its index records {location.nbytes} "
                f"(dtype {info['dtype']}, shape {list(info['shape'])})",
                f"{size} bytes (cut short, or from another save)",
            )
        return location, dtype

    def _safetensors_path(self, path: str) -> str:
        """Where an in-memory index's ``safetensors_file`` is: as written (absolute, or relative to the
        working directory, as other writers of offload indexes mean it), else inside the offload folder.
        Entries read from the folder's ``index.json`` are resolved inside the folder only."""
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

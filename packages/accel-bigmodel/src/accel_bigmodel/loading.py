"""Load a checkpoint into a (possibly empty) model, placing each weight where a device map says.

The checkpoint is first compared with the model (missing and unexpected names, shape mismatches)
from file headers only, before any weight moves. Weights mapped to "disk" that already sit in a
safetensors file are indexed in place, never copied (through a hard link, else a symbolic link, inside
the offload folder, so the index names only files in its folder); other disk weights go to ``offload_folder``, one
safetensors file per ``.bin`` file read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.checkpoint import describe, is_safetensors, resolve_checkpoint
from accel_bigmodel.offload import offload_state_dict as write_offload_file
from accel_bigmodel.offload import offload_weight, save_offload_index
from accel_bigmodel.planning import check_device_map, device_for
from accel_bigmodel.progress import progress
from accel_bigmodel.safe_write import link_into
from accel_bigmodel.sizes import str_to_dtype, walk_modules
from accel_bigmodel.tensor_io import FileMaps, TensorLocation, dtype_name
from accel_bigmodel.tensors import rebuild_parameter
from accel_bigmodel.tied import retie_parameters
from accel_state.logging import get_logger

logger = get_logger(__name__)


class CheckpointMismatchError(ValueError):
    """The checkpoint's names or shapes do not match the model's (raised with ``strict=True``)."""


def _scan_model(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, nn.Module], set[str], list[list[str]]]:
    """One walk: the tensors a checkpoint should hold, modules by name, buffer names, tied groups."""
    expected: dict[str, torch.Tensor] = {}
    modules: dict[str, nn.Module] = {}
    buffers: set[str] = set()
    by_id: dict[int, list[str]] = {}
    for prefix, module in walk_modules(model):
        modules.setdefault(prefix, module)
        dot = f"{prefix}." if prefix else ""
        for name, param in module._parameters.items():
            if param is not None:
                expected[dot + name] = param
                by_id.setdefault(id(param), []).append(dot + name)
        for name, buf in module._buffers.items():
            if buf is not None:
                buffers.add(dot + name)
                if name not in module._non_persistent_buffers_set:
                    expected[dot + name] = buf
    tied = sorted(sorted(names) for names in by_id.values() if len(names) > 1)
    return expected, modules, buffers, tied


def check_checkpoint_matches(
    expected: Mapping[str, torch.Tensor],
    found: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    tied_groups: list[list[str]],
    strict: bool,
    source: str,
) -> set[str]:
    """Report missing/unexpected names and shape mismatches: an error when ``strict``, else a warning.

    Returns the names whose shapes differ (they are skipped when not strict).
    """
    tied_ok = set()
    for group in tied_groups:
        if any(name in found for name in group):
            tied_ok.update(group)
    missing = [k for k in expected if k not in found and k not in tied_ok]
    unexpected = [k for k in found if k not in expected]
    bad_shapes = {k for k in expected if k in found and tuple(found[k][0]) != expected[k].shape}
    shapes = [
        f"{k}: checkpoint {tuple(found[k][0])} vs model {tuple(expected[k].shape)}" for k in expected if k in bad_shapes
    ]
    if not (missing or unexpected or shapes):
        return set()

    def listing(items: list[str]) -> str:
        return ", ".join(items[:20]) + (f" ... ({len(items)} in all)" if len(items) > 20 else "")

    parts = []
    if missing:
        parts.append(f"missing keys: {listing(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {listing(unexpected)}")
    if shapes:
        parts.append(f"shape mismatches: {listing(shapes)}")
    message = f"Checkpoint {source!r} does not match the model; " + "; ".join(parts) + "."
    if strict:
        raise CheckpointMismatchError(message)
    if shapes:
        message += " Weights whose shapes differ are not loaded."
    warnings.warn(message, stacklevel=3)
    logger.warning(message)  # the documented system logs it: code that captures logs sees it too
    return bad_shapes


def _target_dtype(
    name: str, current: torch.Tensor, stored: torch.dtype, dtype: torch.dtype | None, fp32_modules: list[str]
) -> torch.dtype:
    if not stored.is_floating_point:
        return stored
    if dtype is None:
        return current.dtype if current.is_floating_point() else stored
    if fp32_modules and any(m == name or name.startswith(m + ".") or f".{m}." in f".{name}" for m in fp32_modules):
        return torch.float32
    return dtype


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: dict[str, int | str | torch.device] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load ``checkpoint`` (file, folder, or sharded index) into ``model`` in place, following ``device_map``.

    Weights mapped to "disk" are indexed in ``offload_folder`` (``index.json``); with
    ``offload_state_dict`` CPU weights are kept out of RAM until every file has been read. With
    ``offload_8bit_bnb`` the full-precision weights of bitsandbytes 8-bit parameters mapped to "disk"
    are quantized on the CPU first, and the int8 weight and its row statistics (``<module>.SCB``) are
    offloaded instead (accel-quant's ``load_and_quantize_model`` reloads them).

    Args:
        model: The model (an `nn.Module`).
        checkpoint: A checkpoint file, a folder holding one, or the index file of a sharded checkpoint.
        device_map: Module name -> device (`"cpu"`, `"disk"`, an index or a `torch.device`); `""` names the
            whole model.
        offload_folder: Folder the weights mapped to `"disk"` are written to.
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        offload_state_dict: Offload the CPU part of the weights to disk while loading, to limit peak memory.
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        keep_in_fp32_modules: Names of modules whose weights stay in float32 whatever `dtype` says.
        offload_8bit_bnb: Offload 8-bit bitsandbytes weights with their statistics.
        strict: Raise when the checkpoint and the model do not have the same weights (else warn).
        full_state_dict: The checkpoint holds the full (unsharded) weights.
        broadcast_from_rank0: Read the checkpoint on process 0 only and broadcast the weights to the others.
    """
    if broadcast_from_rank0:
        raise NotImplementedError(
            "broadcast_from_rank0=True is not supported by accel-bigmodel yet: load on every rank, or load "
            "on rank 0 and use accel-train's FSDP loading."
        )
    torch_dtype = str_to_dtype(dtype) if dtype is not None else None
    fp32_modules = list(keep_in_fp32_modules or [])
    if device_map is not None:
        check_device_map(model, device_map)
        if "disk" in {str(v) for v in device_map.values()} and offload_folder is None:
            raise ValueError(
                "The device_map puts some modules on 'disk' but no offload_folder was given: pass "
                "offload_folder=<a folder> to hold them."
            )
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)

    files = resolve_checkpoint(checkpoint)
    found, opened = describe(files.files)
    expected, modules, buffer_names, tied_groups = _scan_model(model)
    skip = check_checkpoint_matches(expected, found, tied_groups, strict, os.fspath(checkpoint))

    offload_index: dict[str, Any] = {}
    linked: dict[str, str] = {}  # checkpoint file -> its name inside the offload folder
    deferred: dict[str, Any] = {}  # cpu weights kept out of RAM until the end (offload_state_dict)
    temp_dir = tempfile.mkdtemp(prefix="accel-offload-") if offload_state_dict else None
    maps = FileMaps()
    where = _DeviceLookup(device_map)
    try:
        for path in progress(
            files.files,
            total=len(files.files),
            desc="Loading checkpoint shards",
            enabled=None if len(files.files) > 1 else False,
        ):
            entry = opened[path]
            safetensors_file = is_safetensors(path)
            bin_to_disk: dict[str, torch.Tensor] = {}
            for name, raw_item in entry.items():
                item: Any = raw_item
                current = expected.get(name)
                if current is None or name in skip or not _is_weight(item):
                    continue
                stored = item.dtype
                wanted = _target_dtype(name, current, stored, torch_dtype, fp32_modules)
                device = where(name)
                if device == "disk" and (offload_buffers or name not in buffer_names):
                    if offload_8bit_bnb and _is_8bit_bnb_param(current) and stored.is_floating_point:
                        value = maps.tensor(item) if safetensors_file else item
                        _quantize_and_offload_8bit(current, name, value, str(offload_folder), offload_index)
                        continue
                    if safetensors_file:
                        if path not in linked:  # the index names a link inside the folder, never a path out
                            linked[path] = link_into(str(offload_folder), path)
                        offload_index[name] = {
                            "safetensors_file": linked[path],
                            "weight_name": name,
                            "dtype": dtype_name(wanted),
                        }
                    else:  # gathered and written as one safetensors file once this .bin is read
                        bin_to_disk[name] = item.to(wanted)
                    continue
                if device == "disk":
                    device = "cpu"
                if temp_dir is not None and device == "cpu" and name not in buffer_names:
                    if safetensors_file:
                        deferred[name] = (path, item, wanted)
                    else:
                        deferred[name] = None
                        offload_weight(item.to(wanted), name, temp_dir)
                        deferred[name] = ("dat", wanted)
                    continue
                value = maps.tensor(item) if safetensors_file else item
                _place(modules, name, value, wanted, where.target(device))
            if bin_to_disk:
                offload_index.update(write_offload_file(str(offload_folder), bin_to_disk))
                bin_to_disk.clear()
            opened[path] = None  # drop the .bin dict (and its memory map) once read
        for name, info in deferred.items():
            if info[0] == "dat":
                from accel_bigmodel.offload import load_offloaded_weight

                value = load_offloaded_weight(
                    os.path.join(str(temp_dir), f"{name}.dat"),
                    {"dtype": dtype_name(info[1]), "shape": list(expected[name].shape)},
                )
                _place(modules, name, value, info[1], None)
            else:
                path, item, wanted = info
                _place(modules, name, maps.tensor(item), wanted, None)
    finally:
        maps.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    if offload_index:
        save_offload_index(offload_index, offload_folder)  # type: ignore[arg-type]
    retie_parameters(model, tied_groups)


class _DeviceLookup:
    """Where each tensor goes under ``device_map``, worked out once per module rather than once per tensor.

    Calling it with a tensor name gives its entry in the map (its own, else its longest module prefix's;
    "cpu" without a map or without a matching entry); `target()` turns that entry into the torch device
    a value must be moved to, or ``None`` when it stays on the CPU.
    """

    def __init__(self, device_map: Mapping[str, Any] | None) -> None:
        self._map = device_map
        self._by_module: dict[str, Any] = {}
        self._targets: dict[Any, torch.device | None] = {}

    def __call__(self, name: str) -> Any:
        device_map = self._map
        if device_map is None:
            return "cpu"
        if name in device_map:  # a map may name a tensor itself
            device = device_map[name]
            return "cpu" if device is None else device
        module_name = name.rpartition(".")[0]
        device = self._by_module.get(module_name, self)
        if device is self:
            device = device_for(module_name, device_map)
            device = self._by_module[module_name] = "cpu" if device is None else device
        return device

    def target(self, device: Any) -> torch.device | None:
        """The torch device for the map entry ``device`` (an index is a CUDA device); ``None`` for "cpu"."""
        key = (type(device), device)
        if key not in self._targets:
            if isinstance(device, int):
                self._targets[key] = torch.device("cuda", device)
            elif isinstance(device, str | torch.device) and str(device) != "cpu":
                self._targets[key] = torch.device(device)
            else:
                self._targets[key] = None
        return self._targets[key]


def _place(
    modules: dict[str, nn.Module], name: str, value: torch.Tensor, dtype: torch.dtype, target: torch.device | None
) -> None:
    """Fast path of set_module_tensor_to_device for loading: shapes were checked up front.

    ``target`` is the device the value is moved to, ``None`` to keep it on the CPU where it was read.
    """
    module_name, _, attr = name.rpartition(".")
    owner = modules[module_name]
    if value.dtype != dtype:
        value = value.to(dtype)
    if target is not None and value.device != target:
        value = value.to(target)
    if attr in owner._buffers:
        owner._buffers[attr] = value
        return
    old = owner._parameters[attr]
    requires_grad = bool(old is not None and old.requires_grad and (value.is_floating_point() or value.is_complex()))
    if old is None or type(old) is nn.Parameter:
        owner._parameters[attr] = nn.Parameter(value, requires_grad=requires_grad)
    else:
        owner._parameters[attr] = rebuild_parameter(old, value, requires_grad)


def _is_8bit_bnb_param(param: torch.Tensor) -> bool:
    """A bitsandbytes ``Int8Params`` (recognised by name: accel-bigmodel does not import bitsandbytes)."""
    return type(param).__name__ == "Int8Params"


def _quantize_and_offload_8bit(
    placeholder: torch.Tensor, name: str, value: torch.Tensor, folder: str, index: dict[str, Any]
) -> None:
    """Quantize one full-precision weight to int8 on the CPU and offload it with its ``SCB`` statistics."""
    param_cls: Any = type(placeholder)
    quantized = param_cls(value.to("cpu"), requires_grad=False, has_fp16_weights=False).to("cpu")
    offload_weight(quantized.data, name, folder, index=index)
    module_name = name.rpartition(".")[0]
    offload_weight(quantized.SCB, f"{module_name}.SCB" if module_name else "SCB", folder, index=index)


def _is_weight(item: object) -> bool:
    return isinstance(item, torch.Tensor | TensorLocation)

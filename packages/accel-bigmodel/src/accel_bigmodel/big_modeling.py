"""Run models bigger than memory: dispatch across devices, offload to CPU or disk, load and dispatch.

These functions combine planning (`accel_bigmodel.planning`), loading
(`accel_bigmodel.loading`) and hooks (`accel_bigmodel.hooks`); offloaded weights are
prefetched in the background (`accel_bigmodel.prefetch`).
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import torch
from torch import nn

from accel_bigmodel.empty import init_empty_weights, init_on_device
from accel_bigmodel.hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from accel_bigmodel.loading import load_checkpoint_in_model
from accel_bigmodel.offload import INDEX_NAME, OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict
from accel_bigmodel.planning import check_device_map, get_balanced_memory, infer_auto_device_map
from accel_bigmodel.prefetch import enable_prefetch
from accel_bigmodel.tied import find_tied_parameters, retie_parameters, tied_params_map_for

__all__ = [
    "init_empty_weights",
    "init_on_device",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "load_checkpoint_and_dispatch",
    "attach_layerwise_casting_hooks",
]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _first_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def cpu_offload(
    model: nn.Module,
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep one copy of the weights on the CPU; each layer's weights go to ``execution_device`` only for its forward.

    Args:
        model: The model (an `nn.Module`).
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        state_dict: A state dict (name -> tensor).
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
    """
    if execution_device is None:
        execution_device = _first_device(model)
    if state_dict is None:
        state_dict = {name: tensor.detach().to("cpu") for name, tensor in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=state_dict,
        preload_module_classes=preload_module_classes,
    )
    enable_prefetch(model)
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Move the whole model to ``execution_device`` at its first forward and keep it there until ``hook.offload()``.

    Chain models with ``prev_module_hook``: running this model offloads the previous one.

    Args:
        model: The model (an `nn.Module`).
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        prev_module_hook: The hook of the model that runs before this one; it offloads that model when this
            one runs.
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: torch.device | str | int | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Write the weights to ``offload_dir`` (unless it already holds them) and read each layer's weights for its forward.

    Args:
        model: The model (an `nn.Module`).
        offload_dir: Folder of the offloaded weights.
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
    """
    if not os.path.isdir(offload_dir) or not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_device(model)
        if execution_device.type == "meta":
            execution_device = torch.device("cpu")
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    enable_prefetch(model)
    return model


def _normalize_device(device: Any) -> Any:
    if isinstance(device, torch.device):
        if device.type == "cuda" and device.index is not None:
            return device.index
        return str(device)
    return device


def dispatch_model(
    model: nn.Module,
    device_map: dict[str, str | int | torch.device],
    main_device: torch.device | str | int | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: dict[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place the model following ``device_map`` and add the hooks that make its forward work across devices.

    Args:
        model: The model (an `nn.Module`).
        device_map: Module name -> device (`"cpu"`, `"disk"`, an index or a `torch.device`); `""` names the
            whole model.
        main_device: The device of the main (first) part of the model.
        state_dict: A state dict (name -> tensor).
        offload_dir: Folder of the offloaded weights.
        offload_index: Index of the weights already offloaded to `offload_dir`.
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
        force_hooks: Add the device-alignment hooks even when the whole model is on one device.
    """
    check_device_map(model, device_map)
    device_map = {k: _normalize_device(v) for k, v in device_map.items()}
    values = set(device_map.values())
    if len(values) > 1 or force_hooks:
        if main_device is None:
            if values <= {"cpu", "disk"}:
                main_device = "cpu"
            else:
                main_device = next(d for d in device_map.values() if d not in ("cpu", "disk"))
        if main_device != "cpu":
            cpu_modules = [n for n, d in device_map.items() if d == "cpu"]
            if state_dict is None and cpu_modules:
                state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [n for n, d in device_map.items() if d == "disk"]
        if disk_modules and offload_dir is None and offload_index is None:
            raise ValueError(
                f"The device_map puts {disk_modules[:5]} on 'disk' but no offload_dir was given: pass "
                "offload_dir=<a folder> (or offload_index)."
            )
        if disk_modules and offload_index is None and not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):  # type: ignore[arg-type]
            disk_state = extract_submodules_state_dict(model.state_dict(), disk_modules)
            meta = [k for k, v in disk_state.items() if v.device.type == "meta"]
            if meta:
                raise ValueError(f"Modules mapped to 'disk' have no weights to offload (still on meta): {meta[:5]}.")
            offload_state_dict(offload_dir, disk_state)  # type: ignore[arg-type]
        execution_device = {n: (main_device if d in ("cpu", "disk") else d) for n, d in device_map.items()}
        execution_device[""] = main_device
        offloaded_devices = ("disk",) if main_device in ("cpu", "mps") else ("cpu", "disk")
        offload = {n: d in offloaded_devices for n, d in device_map.items()}
        save_folder = offload_dir if disk_modules else None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map: Any = OffloadedWeightsLoader(
                state_dict=state_dict,
                save_folder=save_folder,
                index=offload_index,
                device=main_device if offload_index is not None else None,
            )
        else:
            weights_map = None
        tied_params = find_tied_parameters(model)
        tied_map = tied_params_map_for(model, tied_params)
        attach_align_device_hook_on_blocks(
            model,
            execution_device=execution_device,
            offload=offload,
            offload_buffers=offload_buffers,
            weights_map=weights_map,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_map,
        )
        retie_parameters(model, tied_params)
        enable_prefetch(model)
        if any(offload.values()) or len({d for d in values if d not in ("cpu", "disk")}) > 1:
            _guard_moves(model)
    else:
        device = next(iter(values))
        if device == "disk":
            raise ValueError("The whole model is mapped to 'disk': use disk_offload(model, offload_dir) instead.")
        target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if not _all_on(model, target):
            model.to(target)
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]
    return model


def _all_on(model: nn.Module, target: torch.device) -> bool:
    """Whether every parameter and buffer of ``model`` is on ``target``: one walk over the modules'
    own tensors, without the per-tensor generators of ``model.parameters()``."""
    stack = [model]
    while stack:
        module = stack.pop()
        for tensor in (*module._parameters.values(), *module._buffers.values()):
            if tensor is not None and tensor.device != target:
                return False
        stack.extend(child for child in module._modules.values() if child is not None)
    return True


def _guard_moves(model: nn.Module) -> None:
    """Make ``.to()``/``.cuda()``/... on a dispatched model warn and do nothing (it would break the hooks)."""

    def refuse(name: str) -> Any:
        def method(*args: Any, **kwargs: Any) -> nn.Module:
            warnings.warn(
                f"model.{name}() ignored: this model is dispatched across devices (see model.hf_device_map); "
                "remove its hooks with remove_hook_from_submodules first.",
                stacklevel=2,
            )
            return model

        return method

    for name in ("to", "cuda", "cpu", "xpu", "npu", "mlu", "musa"):
        if hasattr(model, name):
            setattr(model, name, refuse(name))


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: str | dict[str, int | str | torch.device] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (usually built under ``init_empty_weights``) and dispatch it.

    ``device_map`` is a dict or one of "auto", "balanced", "balanced_low_0", "sequential".

    Args:
        model: The model (an `nn.Module`).
        checkpoint: A checkpoint file, a folder holding one, or the index file of a sharded checkpoint.
        device_map: Module name -> device (`"cpu"`, `"disk"`, an index or a `torch.device`); `""` names the
            whole model.
        max_memory: Device -> memory budget (an int of bytes or text such as `"10GiB"`); `None` uses what is
            free.
        no_split_module_classes: Class names of modules that must stay whole on one device (for example a
            transformer block).
        offload_folder: Folder the weights mapped to `"disk"` are written to.
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        offload_state_dict: Offload the CPU part of the weights to disk while loading, to limit peak memory.
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
        force_hooks: Add the device-alignment hooks even when the whole model is on one device.
        strict: Raise when the checkpoint and the model do not have the same weights (else warn).
        full_state_dict: The checkpoint holds the full (unsharded) weights.
        broadcast_from_rank0: Read the checkpoint on process 0 only and broadcast the weights to the others.
    """
    if isinstance(device_map, str):
        strategy: str = device_map
        if strategy not in DEVICE_MAP_STRATEGIES:
            raise ValueError(
                f"device_map={device_map!r} is not a strategy: use a dict or one of {list(DEVICE_MAP_STRATEGIES)}."
            )
        if strategy != "sequential":
            max_memory = get_balanced_memory(  # type: ignore[assignment]
                model,
                max_memory=max_memory,
                no_split_module_classes=no_split_module_classes,
                dtype=dtype,
                low_zero=(strategy == "balanced_low_0"),
            )
        device_map = infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    assert not isinstance(device_map, str)
    if offload_state_dict is None and device_map is not None and "disk" in {str(v) for v in device_map.values()}:
        offload_state_dict = True
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=bool(offload_state_dict),
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of the layers of ``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`` (linear and
    convolution layers, see ``accel.utils.constants``) in ``storage_dtype`` and cast them to
    ``compute_dtype`` only for their forward.

    A module whose name matches ``skip_modules_pattern`` (regular expressions, searched in the dotted
    name) or whose class is in ``skip_modules_classes`` is left as it is, with everything inside it.

    Args:
        module: The module.
        storage_dtype: The dtype weights are stored in (for example `torch.float8_e4m3fn`).
        compute_dtype: The dtype weights are cast to for the forward.
        skip_modules_pattern: Regular expressions of module names left as they are.
        skip_modules_classes: Module classes left as they are.
        non_blocking: Copy asynchronously where the device allows it.
    """
    from accel_state.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    upcast_layers: tuple[type, ...] = tuple(SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING)  # type: ignore[arg-type]

    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else tuple(skip_modules_pattern or ())
    compiled = [re.compile(p) for p in patterns]
    skip_classes = tuple(skip_modules_classes or ())
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        name, sub = stack.pop()
        if (skip_classes and isinstance(sub, skip_classes)) or any(p.search(name) for p in compiled):
            continue  # the whole subtree keeps its dtype
        if isinstance(sub, upcast_layers):
            add_hook_to_module(sub, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
            continue
        children = [(f"{name}.{child}" if name else child, m) for child, m in sub.named_children()]
        stack.extend(reversed(children))

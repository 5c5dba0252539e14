"""The modeling utilities under their documented module (``accel.utils.modeling``): sizes, device maps, loading.

The implementations live in small modules (sizes, planning, device_memory, tied, tensors, checkpoint,
loading, hooks); this module gathers them and adds the helpers that read an offloaded model back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel_bigmodel.alignment import align_module_device, has_offloaded_params
from accel_bigmodel.checkpoint import load_state_dict
from accel_bigmodel.device_memory import get_max_memory
from accel_bigmodel.loading import CheckpointMismatchError, check_checkpoint_matches, load_checkpoint_in_model
from accel_bigmodel.offload import load_offloaded_weights
from accel_bigmodel.planning import (
    check_device_map,
    clean_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from accel_bigmodel.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
    get_module_leaves,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
)
from accel_bigmodel.tensors import set_module_tensor_to_device
from accel_bigmodel.tied import (
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
)

__all__ = [
    "CheckpointMismatchError",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_checkpoint_matches",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_children_bottom_up",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Whether two devices are the same, treating "cuda" and "cuda:0" (current index) alike.

    Args:
        first_device: A device.
        second_device: Another device.
    """
    if first_device.type != second_device.type:
        return False
    if first_device.type == "cuda":
        first = first_device.index if first_device.index is not None else torch.cuda.current_device()
        second = second_device.index if second_device.index is not None else torch.cuda.current_device()
        return first == second
    return first_device == second_device


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """Size of a module once the modules it is tied to are placed with it.

    A device-map planner that places a module whose parameters are tied to parameters of other
    modules still waiting in its queue must place those modules on the same device: this adds their
    sizes, less the tied parameters themselves, which the module already counts (a tied parameter that
    ``module_sizes`` counts only under its other name has no entry and is taken off nothing).

    Args:
        tied_params: names of the parameters outside the module that are tied to its own.
        module_size: size in bytes of the module alone.
        module_sizes: size in bytes of every module and parameter by name (``compute_module_sizes``).
        modules_to_treat: the planner's queue of ``(name, module)`` still to place; each tied parameter
            must belong to one of them.

    Returns:
        the total size, the names of the tied modules, and the modules, in the order of ``tied_params``.

    Raises:
        ValueError: a tied parameter belongs to no module of ``modules_to_treat``.
    """
    if not tied_params:
        return module_size, [], []
    names: list[str] = []
    modules: list[nn.Module] = []
    total = module_size
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if param.startswith(f"{n}.")), None)
        if owner is None:
            queued = [n for n, _ in modules_to_treat[:10]]
            raise ValueError(
                f"Tied parameter {param!r} belongs to none of the modules still to place ({queued}): pass the "
                "modules that hold every tied parameter in modules_to_treat."
            )
        names.append(owner[0])
        modules.append(owner[1])
        # a tied parameter counted once (under its other name) has no entry: nothing to take off
        total += module_sizes[owner[0]] - module_sizes.get(param, 0)
    return total, names, modules


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module of ``model``, children before their parent (post-order), optionally with names.

    Args:
        model: The model (an `nn.Module`).
        return_fqns: Return `(name, module)` pairs instead of modules.
    """
    order: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module, bool]] = [("", model, False)]
    while stack:
        name, module, done = stack.pop()
        if done:
            order.append((name, module))
            continue
        stack.append((name, module, True))
        for child_name, child in reversed(list(module.named_children())):
            stack.append((f"{name}.{child_name}" if name else child_name, child, False))
    return order if return_fqns else [m for _, m in order]


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, Any]:
    """Add ``module``'s (offloaded) weights to ``state_dict`` under ``module_name``, read onto ``device_to_put_offload``.

    Args:
        module: The module.
        module_name: Name of `module` in the model (the prefix of its weights' names).
        state_dict: A state dict (name -> tensor).
        device_to_put_offload: Device the offloaded weights are read onto.
    """
    with align_module_device(module, device_to_put_offload):
        for name, tensor in module.state_dict().items():
            key = f"{module_name}.{name}" if module_name else name
            if key in state_dict and tensor.device.type != "meta":
                state_dict[key] = tensor.detach().to(device_to_put_offload)
    return state_dict


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a model with offloaded weights, on the CPU.

    Args:
        model: The model (an `nn.Module`).
    """
    state_dict: dict[str, Any] = {}
    placeholders = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        state_dict[name] = tensor.detach().to("cpu") if tensor.device.type != "meta" else "placeholder"
        if tensor.device.type == "meta":
            placeholders.append(name)
    for name, module in model.named_modules():
        if name and has_offloaded_params(module):
            get_state_dict_from_offload(module, name, state_dict)
    if has_offloaded_params(model):
        get_state_dict_from_offload(model, "", state_dict)
    left = [k for k, v in state_dict.items() if isinstance(v, str)]
    if left:
        raise RuntimeError(f"Could not read these offloaded weights back: {left[:10]}.")
    return state_dict

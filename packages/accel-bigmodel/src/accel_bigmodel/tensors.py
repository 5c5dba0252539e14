"""Put one parameter or buffer of a module on a device, optionally with a new value and dtype."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel_bigmodel.sizes import str_to_dtype

_INT_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


def _resolve(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    owner = module
    if "." in tensor_name:
        path, _, tensor_name = tensor_name.rpartition(".")
        for part in path.split("."):
            child = getattr(owner, part, None)
            if not isinstance(child, nn.Module):
                raise ValueError(
                    f"{type(owner).__name__} has no submodule {part!r} (looking for {path}.{tensor_name})."
                )
            owner = child
    if tensor_name not in owner._parameters and tensor_name not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} has no parameter or buffer named {tensor_name!r}.")
    return owner, tensor_name


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Move ``module``'s tensor ``tensor_name`` (dotted) to ``device``, replacing its data with ``value``.

    Without ``dtype`` the value takes the dtype the model already has (as ``load_state_dict`` does);
    with it, floating values are cast and integer ones kept. A value of the wrong shape is an error.

    Args:
        module: The module holding the tensor.
        tensor_name: Dotted name of the parameter or buffer inside `module`.
        device: The target device.
        value: The new data; `None` moves the current data.
        dtype: The dtype of the result; `None` keeps the current one (floating values are converted to it).
        fp16_statistics: The statistics of an 8-bit bitsandbytes weight (`SCB`).
        tied_params_map: Shared cache of tied weights already moved to the execution device (data pointer ->
            device -> tensor), so a tied weight is moved once.
        non_blocking: Copy asynchronously where the device allows it.
        clear_cache: Empty the device cache after the move.
    """
    owner, name = _resolve(module, tensor_name)
    is_buffer = name in owner._buffers
    old = owner._buffers[name] if is_buffer else owner._parameters[name]
    if isinstance(device, int):
        device = torch.device("cuda", device) if torch.cuda.is_available() else torch.device(device)
    device = torch.device(device) if not isinstance(device, torch.device) else device

    if value is None and dtype is None and old is not None and old.device == device:
        return
    if old is None:
        if value is None:
            return
    elif old.device.type == "meta" and value is None and device.type != "meta":
        raise ValueError(f"{tensor_name} is on the meta device: give a `value` to put on {device}.")

    if value is not None:
        if old is not None and old.shape != value.shape and type(old).__name__ not in ("Params4bit", "Int8Params"):
            raise ValueError(
                f"Cannot set a tensor of shape {tuple(value.shape)} as {tensor_name!r}, which has shape {tuple(old.shape)}."
            )
        if dtype is None:
            if old is not None and value.dtype != old.dtype and value.is_floating_point():
                value = value.to(old.dtype)
        elif not str(value.dtype).startswith(_INT_PREFIXES):
            value = value.to(str_to_dtype(dtype))

    if tied_params_map is not None and value is not None and value.device.type != "meta":
        shared = tied_params_map.get(value.data_ptr())
        if shared is not None and device in shared:
            new_value = shared[device]
            _assign(owner, name, is_buffer, old, new_value)
            return

    source = old if value is None else value
    assert source is not None
    new_value = source.to(device, non_blocking=non_blocking)
    if dtype is not None and value is None and not str(new_value.dtype).startswith(_INT_PREFIXES):
        new_value = new_value.to(str_to_dtype(dtype))
    if fp16_statistics is not None:
        new_value.SCB = fp16_statistics.to(device)  # type: ignore[attr-defined]
    _assign(owner, name, is_buffer, old, new_value)
    if tied_params_map is not None and value is not None and value.device.type != "meta":
        shared = tied_params_map.get(value.data_ptr())
        if shared is not None:
            shared[device] = owner._buffers[name] if is_buffer else owner._parameters[name]  # type: ignore[assignment]


def _assign(owner: nn.Module, name: str, is_buffer: bool, old: torch.Tensor | None, new_value: torch.Tensor) -> None:
    if is_buffer:
        owner._buffers[name] = new_value
        return
    if isinstance(new_value, nn.Parameter) and (old is None or type(new_value) is type(old)):
        owner._parameters[name] = new_value
        return
    requires_grad = old.requires_grad if old is not None else False
    if requires_grad and not (new_value.is_floating_point() or new_value.is_complex()):
        requires_grad = False
    data = new_value.data if isinstance(new_value, nn.Parameter) else new_value
    owner._parameters[name] = rebuild_parameter(old, data, requires_grad)


def rebuild_parameter(old: torch.Tensor | None, data: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    """``data`` as a parameter of ``old``'s class, keeping that class's settings.

    A parameter subclass such as bitsandbytes' ``Params4bit`` carries its quantization settings (quant
    type, double quantization, block size, storage dtype) as attributes; rebuilding it from the data
    alone would silently fall back to the class defaults (fp4 instead of nf4, for one).

    Args:
        old: the parameter being replaced (None or a plain tensor gives an ``nn.Parameter``).
        data: the new values.
        requires_grad: whether the new parameter requires gradients.

    Returns:
        the new parameter.
    """
    cls = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
    if cls is nn.Parameter:
        return nn.Parameter(data, requires_grad=requires_grad)
    settings = {k: v for k, v in vars(old).items() if not k.startswith("_") and k != "data"}
    try:
        return cls(data, requires_grad=requires_grad, **settings)
    except TypeError:
        try:
            return cls(data, requires_grad=requires_grad)
        except TypeError:
            return nn.Parameter(data, requires_grad=requires_grad)

"""Build a model without allocating its weights: every parameter created inside goes to a given device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_state.environment import parse_flag_from_env

_TENSOR_CONSTRUCTORS = ("empty", "zeros", "ones", "full")


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Create models on the meta device: no memory used, no time spent initialising weights.

    Buffers stay on the CPU unless ``include_buffers`` (default: env ``ACCELERATE_INIT_INCLUDE_BUFFERS``).

    Args:
        include_buffers: Also create the buffers on the meta device; `None` reads `ACCELERATE_INIT_INCLUDE_BUFFERS`
            (else `False`).
    """
    if include_buffers is None:
        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device | str | int, include_buffers: bool | None = None) -> Iterator[None]:
    """Put every parameter (and buffer when ``include_buffers``) registered inside on ``device``.

    Args:
        device: The device parameters are created on.
        include_buffers: Also put the buffers on `device`; `None` reads `ACCELERATE_INIT_INCLUDE_BUFFERS` (else
            `False`).
    """
    if include_buffers is None:
        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    device = torch.device(device)
    if include_buffers:
        with device:  # torch's device context puts every factory-made tensor on the device
            yield
        return

    original_register_parameter = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_register_parameter(module, name, param)
        registered: Any = module._parameters[name]
        if param is not None and param.device != device:
            kwargs = dict(registered.__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = _rebuild(type(registered), registered.to(device), kwargs)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original_register_parameter  # type: ignore[method-assign]


def _rebuild(cls: type, data: torch.Tensor, kwargs: dict[str, Any]) -> nn.Parameter:
    requires_grad = kwargs.pop("requires_grad", True)
    try:
        param = cls(data, requires_grad=requires_grad, **kwargs)
    except TypeError:
        param = cls(data, requires_grad=requires_grad)
    return param

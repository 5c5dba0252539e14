"""Reading an offloaded module's weights outside its forward: ``has_offloaded_params``, ``align_module_device``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from accel_bigmodel.hooks import AlignDevicesHook, SequentialHook, _any, _device
from accel_bigmodel.tensors import set_module_tensor_to_device


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` has an `AlignDevicesHook` that offloads its weights.

    Args:
        module: The module.
    """
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return any(isinstance(h, AlignDevicesHook) and h.offload for h in hooks)


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: int | str | torch.device | None = None) -> Iterator[None]:
    """Within the block, ``module``'s weights are materialised (offloaded ones) or on ``execution_device``.

    Args:
        module: The module.
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
    """
    if has_offloaded_params(module):
        hook = _any(module)._hf_hook
        hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
        align = next(h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload)
        saved = (align.execution_device, align._device, align.prefetcher)
        if execution_device is not None:
            align.execution_device, align._device = execution_device, _device(execution_device)
        align.prefetcher = None  # a direct read: the prefetch order is for forwards
        try:
            align.pre_forward(module)
            yield
        finally:
            align.post_forward(module, None)
            align.execution_device, align._device, align.prefetcher = saved
    elif execution_device is not None:
        devices = {name: p.device for name, p in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield

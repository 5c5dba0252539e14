"""Full state dicts of a ZeRO-3 partitioned module, gathered or scattered one submodule at a time.

ZeRO-3 splits every parameter over the data-parallel processes; these helpers gather one submodule's
parameters at a time (``deepspeed.zero.GatheredParameters``), so no process ever holds more than one
submodule in full beyond the result it builds.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["gather_zero3_state_dict", "is_frozen_zero3", "load_zero3_state_dict"]


def gather_zero3_state_dict(module: torch.nn.Module) -> dict[str, Any]:
    """The full state dict of a ZeRO-3 partitioned module on every rank (CPU tensors), gathering one
    submodule's parameters at a time."""
    import deepspeed

    state: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        head = f"{prefix}." if prefix else ""
        params = [p for p in sub.parameters(recurse=False)]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            for name, param in sub._parameters.items():
                if param is not None:
                    state[head + name] = param.detach().cpu().clone()
        for name, buffer in sub._buffers.items():
            if buffer is not None and name not in sub._non_persistent_buffers_set:
                state[head + name] = buffer.detach().cpu().clone()
    return state


def is_frozen_zero3(engine: Any) -> bool:
    """A ZeRO-3 engine prepared without optimizer (inference, a frozen teacher)."""
    return engine.zero_optimization_partition_weights() and type(engine.optimizer).__name__ == "DeepSpeedZeRoOffload"


def load_zero3_state_dict(module: torch.nn.Module, state: dict[str, Any], strict: bool = True) -> None:
    """Copy a full state dict into a ZeRO-3 partitioned module, one submodule at a time (every rank
    calls it; rank 0's values are partitioned to all)."""
    import deepspeed
    import torch.distributed as dist

    expected = set()
    for prefix, sub in module.named_modules():
        head = f"{prefix}." if prefix else ""
        params = [p for p in sub.parameters(recurse=False)]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if dist.get_rank() == 0:
                for name, param in sub._parameters.items():
                    if param is not None and head + name in state:
                        param.data.copy_(state[head + name])
        for name, param in sub._parameters.items():
            if param is not None:
                expected.add(head + name)
        for name, buffer in sub._buffers.items():
            if buffer is not None and name not in sub._non_persistent_buffers_set:
                expected.add(head + name)
                if head + name in state:
                    buffer.data.copy_(state[head + name])
    if strict and set(state) != expected:
        raise KeyError(
            f"state dict does not match the model: missing {sorted(expected - set(state))}, "
            f"unexpected {sorted(set(state) - expected)}"
        )

"""The real values of weights that accel-bigmodel's hooks keep off the model (CPU or disk offload).

A model dispatched with offload holds ``meta`` tensors in place of the offloaded weights; its hooks
(``module._hf_hook``, an ``AlignDevicesHook`` or a ``SequentialHook`` holding one) keep a
``weights_map`` to read them from. Saving such a model must write the real values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["materialise_offloaded", "offload_holder"]


def _weight_maps(hook: Any) -> list[Any]:
    if hook is None:
        return []
    inner = getattr(hook, "hooks", None)
    if inner is not None:  # SequentialHook
        return [m for h in inner for m in _weight_maps(h)]
    weights_map = getattr(hook, "weights_map", None)
    return [weights_map] if getattr(hook, "offload", False) and weights_map is not None else []


def offload_holder(modules: Mapping[str, torch.nn.Module], key: str) -> tuple[Any, str] | None:
    """The ``weights_map`` of the offload hook that holds weight ``key`` and its name there, or None.

    ``modules`` is ``dict(model.named_modules())``. The hook of the deepest module on ``key``'s path
    that knows the weight wins; nothing is read from the map (a disk offload stays on disk).

    Args:
        modules: the model's modules by name.
        key: the weight's name in the model's state dict (``"0.weight"``).
    """
    parts = key.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        module = modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        rest = ".".join(parts[cut:])
        for weights_map in _weight_maps(getattr(module, "_hf_hook", None)):
            if _holds(weights_map, rest):
                return weights_map, rest
    return None


def _holds(weights_map: Any, name: str) -> bool:
    try:
        return name in weights_map
    except TypeError:  # a map without membership tests: ask for the value
        try:
            weights_map[name]
        except KeyError:
            return False
        return True


def materialise_offloaded(model: torch.nn.Module, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each ``meta`` tensor replaced by the value its offload hook would load.

    A weight with no hook to read it from stays ``meta`` and is named in the error raised.
    """
    modules = dict(model.named_modules())
    out = dict(state_dict)
    unresolved = []
    for key, value in state_dict.items():
        if not (isinstance(value, torch.Tensor) and value.device.type == "meta"):
            continue
        holder = offload_holder(modules, key)
        if holder is None:
            unresolved.append(key)
            continue
        weights_map, name = holder
        found = weights_map[name]
        out[key] = found.detach().to("cpu") if isinstance(found, torch.Tensor) else torch.as_tensor(found)
    if unresolved:
        raise ValueError(
            f"{len(unresolved)} weight(s) of {type(model).__name__} are on the meta device and no offload hook "
            f"holds their values, so they cannot be saved: {unresolved[:10]}"
        )
    return out

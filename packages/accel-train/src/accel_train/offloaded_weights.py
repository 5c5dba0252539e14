"""The real values of weights that accel-bigmodel's hooks keep off the model (CPU or disk offload).

A model dispatched with offload holds ``meta`` tensors in place of the offloaded weights; its hooks
(``module._hf_hook``, an ``AlignDevicesHook`` or a ``SequentialHook`` holding one) keep a
``weights_map`` to read them from. Saving such a model must write the real values.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["materialise_offloaded"]


def _weight_maps(hook: Any) -> list[Any]:
    if hook is None:
        return []
    inner = getattr(hook, "hooks", None)
    if inner is not None:  # SequentialHook
        return [m for h in inner for m in _weight_maps(h)]
    weights_map = getattr(hook, "weights_map", None)
    return [weights_map] if getattr(hook, "offload", False) and weights_map is not None else []


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
        parts = key.split(".")
        found = None
        for cut in range(len(parts) - 1, -1, -1):
            module = modules.get(".".join(parts[:cut]))
            rest = ".".join(parts[cut:])
            for weights_map in _weight_maps(getattr(module, "_hf_hook", None)) if module is not None else []:
                try:
                    found = weights_map[rest]
                except KeyError:
                    continue
                break
            if found is not None:
                break
        if found is None:
            unresolved.append(key)
        else:
            out[key] = found.detach().to("cpu") if isinstance(found, torch.Tensor) else torch.as_tensor(found)
    if unresolved:
        raise ValueError(
            f"{len(unresolved)} weight(s) of {type(model).__name__} are on the meta device and no offload hook "
            f"holds their values, so they cannot be saved: {unresolved[:10]}"
        )
    return out

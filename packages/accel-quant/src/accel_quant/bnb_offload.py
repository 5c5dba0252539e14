"""Run offloaded bitsandbytes 8-bit layers: give each reloaded int8 weight its row statistics back.

An offloaded 8-bit weight is stored as two tensors, the int8 matrix (``<module>.weight``) and its
per-row scales (``<module>.SCB``). accel-bigmodel's offload hooks bring the int8 matrix back before
each forward as a plain parameter; the hook here attaches the scales to it, and drops the layer's
cached copy after the forward so the weight leaves memory again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel_bigmodel.hooks import AlignDevicesHook, ModelHook, SequentialHook, add_hook_to_module
from accel_state.imports import is_bnb_available


class Int8StatisticsHook(ModelHook):
    """Attach ``scb`` (the row scales) to a bitsandbytes 8-bit layer's reloaded weight for its forward."""

    def __init__(self, scb: torch.Tensor):
        self.scb = scb

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        weight: Any = module.weight
        if weight.device.type != "meta" and weight.dtype == torch.int8:
            weight.CB = weight.data
            weight.SCB = self.scb if self.scb.device == weight.device else self.scb.to(weight.device)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        state: Any = getattr(module, "state", None)
        if state is not None:
            state.CB = None
            state.SCB = None
        return output


def _offload_hooks(module: nn.Module) -> list[AlignDevicesHook]:
    hook = getattr(module, "_hf_hook", None)
    hooks = list(hook.hooks) if isinstance(hook, SequentialHook) else [hook]
    return [h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload and h.weights_map is not None]


def _scales_for(model: nn.Module, name: str, module: nn.Module) -> torch.Tensor | None:
    """The offloaded ``SCB`` of the 8-bit layer ``name``, from the offload hook of it or of an ancestor."""
    stashed = module.__dict__.pop("_accel_int8_scb", None)
    if stashed is not None:
        return stashed  # type: ignore[no-any-return]
    parts = name.split(".") if name else []
    for depth in range(len(parts), -1, -1):
        owner = model.get_submodule(".".join(parts[:depth])) if depth else model
        relative = ".".join(parts[depth:])
        key = f"{relative}.SCB" if relative else "SCB"
        for hook in _offload_hooks(owner):
            weights_map: Any = hook.weights_map
            if key in weights_map:
                return weights_map[key].to("cpu")  # type: ignore[no-any-return]
    return None


def attach_int8_statistics_hooks(model: nn.Module) -> int:
    """Add an `Int8StatisticsHook` to every offloaded 8-bit layer of ``model``; return how many.

    Raises RuntimeError when an offloaded 8-bit layer's statistics cannot be found.
    """
    if not is_bnb_available():
        return 0
    import bitsandbytes as bnb

    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear8bitLt) or module.weight.device.type != "meta":
            continue
        scb = _scales_for(model, name, module)
        if scb is None:
            raise RuntimeError(
                f"The offloaded 8-bit layer {name!r} has no row statistics ({name}.SCB) among the offloaded "
                "weights: it was not offloaded through load_and_quantize_model."
            )
        add_hook_to_module(module, Int8StatisticsHook(scb), append=True)
        count += 1
    return count

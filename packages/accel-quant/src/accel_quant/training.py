"""Rules for training a bitsandbytes-quantized model (checked by ``Accelerator.prepare``).

Quantized 8-bit / 4-bit weights cannot be trained themselves: a quantized model trains through
trainable adapters added on top of it (for example LoRA layers from peft), with the quantized
weights frozen. The model must also sit whole on the device it trains on.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from accel_state.imports import is_bnb_available

PURE_QUANTIZED_MESSAGE = (
    "It is not possible to train a pure 8-bit or 4-bit model: its quantized weights cannot be updated. Train it "
    "with parameter-efficient fine-tuning instead: add trainable adapters on top of the quantized layers (for "
    "example LoRA layers with the peft library) and pass that model to prepare()."
)


def _bnb_layer_types() -> tuple[type, ...]:
    if not is_bnb_available():
        return ()
    import bitsandbytes as bnb

    return (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)


def is_bnb_quantized(model: nn.Module) -> bool:
    """True when ``model`` was loaded in 8/4-bit (``is_loaded_in_8bit`` / ``is_loaded_in_4bit``) or holds bitsandbytes layers.

    Args:
        model: The model (an `nn.Module`).
    """
    if getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False):
        return True
    layer_types = _bnb_layer_types()
    return bool(layer_types) and any(isinstance(m, layer_types) for m in model.modules())


def _devices(model: nn.Module) -> set[str]:
    device_map = getattr(model, "hf_device_map", None)
    if isinstance(device_map, dict) and device_map:
        return {str(v) for v in device_map.values()}
    return {str(p.device) for p in model.parameters()}


def check_trainable_quantized_model(
    model: nn.Module,
    device: torch.device | str | None = None,
    distributed: bool = False,
) -> None:
    """Raise ValueError when a quantized ``model`` cannot be trained as given; do nothing for other models.

    Refused: a model with no trainable parameter (a pure 8-bit / 4-bit model without adapters); a model
    with offloaded parts (CPU next to an accelerator, or disk); a model spread over several devices
    under a distributed run; a model on another device than ``device``, the one it trains on.

    Args:
        model: The model about to be prepared for training.
        device: The device the run trains on.
        distributed: True when the run has several processes.
    """
    if not is_bnb_quantized(model):
        return
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(PURE_QUANTIZED_MESSAGE)
    devices = _devices(model)
    accelerated = any(d not in ("cpu", "disk", "meta") for d in devices)
    if "disk" in devices or "meta" in devices or ("cpu" in devices and accelerated):
        raise ValueError(
            "A model loaded in 8-bit or 4-bit cannot be trained with parts offloaded to the CPU or disk: load it "
            "without offload (device_map=None, or every module on the training device)."
        )
    if len(devices) > 1 and distributed:
        raise ValueError(
            f"A model loaded in 8-bit or 4-bit spread over several devices ({sorted(devices)}) cannot be trained in "
            "a distributed run: load one whole copy per process, on that process's device."
        )
    if device is not None and len(devices) == 1:
        wanted = _normalise(torch.device(device))
        (found,) = devices
        if _normalise(torch.device(found)) != wanted:
            raise ValueError(
                f"The 8-bit/4-bit model is on {found} but training runs on {wanted}: load it on the training "
                f"device (device_map={{'': {wanted!r}}})."
            )


def _normalise(device: torch.device) -> str:
    if device.type != "cpu" and device.index is None and torch.cuda.is_available() and device.type == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def trainable_parameter_names(model: nn.Module) -> Iterable[str]:
    """Names of the parameters that will be trained (``requires_grad``)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]

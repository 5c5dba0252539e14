"""Tied parameters: find the names that share one parameter, keep them together, tie them again."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import nn


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that refer to the same parameter, each sorted, e.g. ``[["a.weight", "b.weight"]]``.

    Args:
        model: The model (an `nn.Module`).
        **kwargs: Accepted for the documented signature; unused.
    """
    by_id: dict[int, list[str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, param in module._parameters.items():
            if param is not None:
                by_id.setdefault(id(param), []).append(dot + name)
    return sorted(sorted(names) for names in by_id.values() if len(names) > 1)


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), attr


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at the same parameter again (the first one not on meta).

    Args:
        model: The model (an `nn.Module`).
        tied_params: Groups of tied parameter names, as `find_tied_parameters` gives.
    """
    for group in tied_params:
        keeper = None
        for name in group:
            module, attr = _owner(model, name)
            param = getattr(module, attr)
            if keeper is None and param.device.type != "meta":
                keeper = param
        if keeper is None:
            continue
        for name in group:
            module, attr = _owner(model, name)
            setattr(module, attr, keeper)


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: dict[str, Any]) -> None:
    """Warn when the parameters of one tied group are mapped to different devices.

    Args:
        tied_params: Groups of tied parameter names, as `find_tied_parameters` gives.
        device_map: The device map to check.
    """
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len(set(map(str, devices.values()))) > 1:
            message = f"Tied parameters are on different devices: {devices}. Put them on one device in the device map."
            warnings.warn(message, stacklevel=2)
            logging.getLogger(__name__).warning(message)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether the model's config says some weights are tied (transformers-style configs).

    Args:
        model: The model (an `nn.Module`).
    """
    config = getattr(model, "config", None)
    if config is None:
        return False
    return bool(getattr(config, "tie_word_embeddings", False) or getattr(config, "tie_encoder_decoder", False))


def _device_of(name: str, device_map: dict[str, Any]) -> Any:
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            return None
        probe = probe.rpartition(".")[0]


def tied_params_map_for(model: nn.Module, tied_params: list[list[str]]) -> dict[int, dict[torch.device, torch.Tensor]]:
    """The map, keyed by data pointer, that hooks use to share one copy of a tied weight per device."""
    result: dict[int, dict[torch.device, torch.Tensor]] = {}
    for group in tied_params:
        for name in group:
            module, attr = _owner(model, name)
            tensor = getattr(module, attr)
            if tensor.device.type != "meta":
                result[tensor.data_ptr()] = {}
    return result

"""How a model is spread over processes: one device, or DistributedDataParallel.

FSDP, DeepSpeed and Megatron-LM are recognised and refused with :class:`BackendNotAvailableError`.
Also unwrapping (DDP, ``torch.compile``, the mixed-precision forward) and ``torch.compile`` itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accel_state.enums import DistributedType
from accel_train.kwargs_handlers import DistributedDataParallelKwargs
from accel_train.parallel_plugins import not_available
from accel_train.plugins import TorchDynamoPlugin
from accel_train.precision import unwrap_forward

_DDP_TYPES = {
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_HPU,
}
_LATER = {
    DistributedType.FSDP: "FSDP (fsdp_plugin)",
    DistributedType.DEEPSPEED: "DeepSpeed (deepspeed_plugin)",
    DistributedType.MEGATRON_LM: "Megatron-LM (megatron_lm_plugin)",
    DistributedType.XLA: "XLA / TPU training",
}


def uses_ddp(distributed_type: DistributedType) -> bool:
    return distributed_type in _DDP_TYPES


def check_supported(distributed_type: DistributedType) -> None:
    """Raise for the backends that come in a later release."""
    if distributed_type in _LATER:
        raise not_available(_LATER[distributed_type])


def has_trainable_parameters(model: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in model.parameters())


def wrap_ddp(
    model: torch.nn.Module, device: torch.device, kwargs: DistributedDataParallelKwargs | None
) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` with the user's arguments and communication hook."""
    handler = kwargs or DistributedDataParallelKwargs()
    ddp_args = handler.ddp_arguments()
    device_ids = [device.index] if device.type not in ("cpu", "mps") and device.index is not None else None
    output_device = device.index if device_ids else None
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=device_ids, output_device=output_device, **ddp_args
    )
    handler.register_comm_hook(model)
    return model


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``torch.compile`` the model (or each repeated block with regional compilation)."""
    kwargs = plugin.to_compile_kwargs()
    if plugin.use_regional_compilation:
        return _compile_regions(model, kwargs)
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


def _compile_regions(model: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    # Blocks of a ModuleList that share one class are compiled once each (same code, reused graphs).
    compiled_any = False
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            for index, block in enumerate(module):
                module[index] = torch.compile(block, **kwargs)  # type: ignore[assignment]
            compiled_any = True
    return model if compiled_any else torch.compile(model, **kwargs)  # type: ignore[return-value]


def is_compiled(model: Any) -> bool:
    return hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule"


def unwrap(model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
    """The user's model inside DDP / DataParallel / torch.compile wrappers."""
    compiled = None
    if is_compiled(model):
        compiled = model
        model = model._orig_mod
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    if not keep_fp32_wrapper:
        unwrap_forward(model)
    if keep_torch_compile and compiled is not None:
        if compiled._orig_mod is model:
            return compiled
        # The compiled module wraps DDP: give a compiled view of the inner model, leaving the
        # prepared (compiled DDP) model untouched for further training.
        try:
            return type(compiled)(model, compiled.dynamo_ctx)
        except Exception:
            return model
    return model


def no_sync(model: Any) -> contextlib.AbstractContextManager[Any]:
    """The model's ``no_sync`` under DDP, a null context otherwise."""
    inner = model._orig_mod if is_compiled(model) else model
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return inner.no_sync()
    return contextlib.nullcontext()

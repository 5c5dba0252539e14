"""Model wrappers: ``torch.compile`` (whole model or repeated regions) and peeling wrappers off.

Strategies wrap the user's model (DDP, FSDP1, a DeepSpeed engine) and ``torch.compile`` wraps it
again; :func:`unwrap_model` gives the user's module back from any of them. Wrapper classes are
recognised by name, so that unwrapping never imports DeepSpeed or FSDP.
"""

from __future__ import annotations

from typing import Any

import torch

from accel_train.plugins import TorchDynamoPlugin

__all__ = [
    "compile_model",
    "compile_regions",
    "has_compiled_regions",
    "is_compiled",
    "repeated_block_lists",
    "unwrap_model",
]

#: Classes whose ``.module`` is the model they wrap.
_WRAPPER_NAMES = frozenset(
    {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine", "PipelineEngine"}
)


def is_compiled(model: Any) -> bool:
    """True for the module ``torch.compile`` returns."""
    return hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule"


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``torch.compile`` the model, or each repeated block with regional compilation."""
    kwargs = plugin.to_compile_kwargs()
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


def repeated_block_lists(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The ``ModuleList`` s of ``model`` that hold several blocks of one class (a transformer's layers)."""
    return [
        module
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1
    ]


def compile_regions(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile each block of a ``ModuleList`` of identical blocks once (same code, reused graphs);
    the whole model when it has no such list."""
    lists = repeated_block_lists(model)
    for module in lists:
        for index, block in enumerate(module):
            module[index] = torch.compile(block, **compile_kwargs)  # type: ignore[assignment]
    return model if lists else torch.compile(model, **compile_kwargs)  # type: ignore[return-value]


def has_compiled_regions(model: torch.nn.Module) -> bool:
    """True when some submodule (not the model itself) was compiled by :func:`compile_regions`."""
    return any(is_compiled(module) for module in model.modules() if module is not model)


def _is_wrapper(model: Any) -> bool:
    return type(model).__name__ in _WRAPPER_NAMES and isinstance(getattr(model, "module", None), torch.nn.Module)


def unwrap_model(model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
    """The user's model inside DDP / FSDP1 / DeepSpeed / DataParallel / ``torch.compile`` wrappers.

    With ``keep_fp32_wrapper=False`` the mixed-precision forward is removed too; with
    ``keep_torch_compile`` a compiled model stays compiled (a compiled view of the inner model).
    """
    compiled = None
    if is_compiled(model):
        compiled = model
        model = model._orig_mod
    while _is_wrapper(model):
        model = model.module
    if not keep_fp32_wrapper:
        from accel_train.precisions.base import remove_forward_wrapper

        remove_forward_wrapper(model)
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

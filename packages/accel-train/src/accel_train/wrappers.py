"""Model wrappers: ``torch.compile`` (whole model or repeated regions) and peeling wrappers off.

Strategies wrap the user's model (DDP, FSDP1, a DeepSpeed engine) and ``torch.compile`` wraps it
again; `unwrap_model()` gives the user's module back from any of them. Wrapper classes are
recognised by name, so that unwrapping never imports DeepSpeed or FSDP.
"""

from __future__ import annotations

from typing import Any

import torch

from accel_train.plugins import TorchDynamoPlugin

__all__ = [
    "compile_model",
    "compile_regions",
    "compile_regions_in_place",
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
    """True for the module ``torch.compile`` returns.

    Args:
        model: Any object; only a compiled module answers True.
    """
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


def _regions(model: torch.nn.Module) -> tuple[list[torch.nn.ModuleList], set[int]]:
    """The repeated block lists of ``model`` and the ids of every module holding one (to walk into)."""
    lists = repeated_block_lists(model)
    inside = {id(m) for m in lists}
    holders = {id(m) for m in model.modules() if any(id(sub) in inside for sub in m.modules())}
    return lists, holders


def compile_regions(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile each block of a ``ModuleList`` of identical blocks once (same code, reused graphs), and
    every other child on the way (an embedding, a final norm, a ``head``) on its own.

    Compiling one block and reusing its graph for the siblings is much faster than compiling the whole
    model. Modules already compiled are left as they are.

    Args:
        model: the model; its repeated blocks and the children beside them are replaced by compiled modules.
        **compile_kwargs: passed to ``torch.compile``.

    Returns:
        ``model`` itself, or the whole model compiled when it has no repeated blocks.
    """
    lists, holders = _regions(model)
    if not lists:
        return torch.compile(model, **compile_kwargs)  # type: ignore[return-value]
    repeated = {id(m) for m in lists}

    def walk(module: torch.nn.Module) -> None:
        for name, child in list(module.named_children()):
            if id(child) in repeated and isinstance(child, torch.nn.ModuleList):
                for index, block in enumerate(child):
                    if not is_compiled(block):
                        child[index] = torch.compile(block, **compile_kwargs)  # type: ignore[assignment]
            elif id(child) in holders:
                walk(child)
            elif not is_compiled(child) and any(True for _ in child.parameters()):
                setattr(module, name, torch.compile(child, **compile_kwargs))

    walk(model)
    return model


def compile_regions_in_place(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Like `compile_regions()`, but with ``nn.Module.compile``: every module keeps its identity, as
    a DeepSpeed engine or FSDP2-sharded modules need.

    Args:
        model: The model whose repeated blocks (and the children beside them) are compiled in place.
        **compile_kwargs: Arguments of ``torch.compile`` (``backend``, ``mode``, ``fullgraph``, ...).

    Returns:
        ``model`` itself.
    """
    lists, holders = _regions(model)
    if not lists:
        model.compile(**compile_kwargs)
        return model
    repeated = {id(m) for m in lists}

    def walk(module: torch.nn.Module) -> None:
        for child in module.children():
            if id(child) in repeated and isinstance(child, torch.nn.ModuleList):
                for block in child:
                    block.compile(**compile_kwargs)
            elif id(child) in holders:
                walk(child)
            elif any(True for _ in child.parameters()):
                child.compile(**compile_kwargs)

    walk(model)
    return model


def has_compiled_regions(model: Any) -> bool:
    """True when some submodule (not the model itself) was compiled by `compile_regions()`.

    Args:
        model: The model to inspect; anything other than a module gives `False`.
    """
    if not isinstance(model, torch.nn.Module):
        return False
    return any(is_compiled(module) for module in model.modules() if module is not model)


def _is_wrapper(model: Any) -> bool:
    return type(model).__name__ in _WRAPPER_NAMES and isinstance(getattr(model, "module", None), torch.nn.Module)


def unwrap_model(
    model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False
) -> Any:
    """The user's model inside DDP / FSDP1 / DeepSpeed / DataParallel / ``torch.compile`` wrappers.

    Also documented as ``extract_model_from_parallel`` (``accel.utils``).

    Args:
        model: the prepared (wrapped) model.
        keep_fp32_wrapper: keep the mixed-precision forward (autocast, fp32 outputs); ``False``
            removes it from the model, in place.
        keep_torch_compile: give a compiled model back compiled (a compiled view of the inner model);
            ``False`` gives the module that was compiled.
        recursive: also unwrap DDP / DataParallel wrappers found on sub-modules (in place).

    Returns:
        The user's module.
    """
    compiled = None
    if is_compiled(model):
        compiled = model
        model = model._orig_mod
    while _is_wrapper(model):
        model = model.module
    if recursive and isinstance(model, torch.nn.Module):
        for name, child in list(model.named_children()):
            inner = unwrap_model(child, keep_fp32_wrapper, keep_torch_compile, recursive=True)
            if inner is not child:
                setattr(model, name, inner)
    if not keep_fp32_wrapper and isinstance(model, torch.nn.Module):
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

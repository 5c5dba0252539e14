"""The documented FSDP utilities (``accel.utils`` and ``accel.utils.fsdp_utils``).

They are thin, named entry points over the FSDP strategy (`accel_train.strategies.fsdp.strategy`), its
state-dict helpers (`accel_train.strategies.fsdp.state`) and wrap rules (`accel_train.strategies.fsdp.wrap`),
for scripts that save, load or shard by hand. Functions that touch a sharded model are collective:
call them on every rank.

Checkpoint names: a sharded model is the DCP folder ``pytorch_model_fsdp_{index}``, a sharded
optimizer ``optimizer_{index}``; with ``FULL_STATE_DICT`` the model is ``model.safetensors``
(``model_{index}.safetensors``) and the optimizer ``optimizer.bin`` (``optimizer_{index}.bin``),
both written by the main process only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from accel_train import checkpointing as ckpt
from accel_train.checkpoint import file_io
from accel_train.checkpoint.merge import merge_fsdp_weights
from accel_train.optimizer import unwrap_optimizer
from accel_train.strategies.fsdp import state as fsdp_state
from accel_train.strategies.fsdp.plugin import setting_name
from accel_train.strategies.fsdp.wrap import canonical_name, resolve_wrap_classes

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]

_RAM_EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask model loaders (``transformers``' ``from_pretrained``) to read weights on rank 0 only:
    sets ``FSDP_CPU_RAM_EFFICIENT_LOADING=True``; the FSDP strategy then broadcasts them."""
    os.environ[_RAM_EFFICIENT] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Every rank loads the weights itself again (``FSDP_CPU_RAM_EFFICIENT_LOADING=False``)."""
    os.environ[_RAM_EFFICIENT] = "False"


def _sharded(fsdp_plugin: Any) -> bool:
    return setting_name(fsdp_plugin.state_dict_type) != "FULL_STATE_DICT"


def _local(fsdp_plugin: Any) -> bool:
    return setting_name(fsdp_plugin.state_dict_type) == "LOCAL_STATE_DICT"


def _model_file(index: int) -> str:
    return ckpt.model_file(index, True)


def _optimizer_file(index: int) -> str:
    return ckpt.optimizer_file(index)


def _inner(model: Any) -> Any:
    return getattr(model, "_orig_mod", model)


def save_fsdp_model(
    fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, output_dir: str, model_index: int = 0, **_: Any
) -> str:
    """Write ``model`` into ``output_dir`` by the plugin's ``state_dict_type``; returns the path written.

    Sharded: every rank writes its shards into ``pytorch_model_fsdp_{model_index}``. Full: the whole
    state dict is gathered and the main process writes ``model.safetensors``.

    Args:
        fsdp_plugin: The ``FullyShardedDataParallelPlugin`` whose ``state_dict_type`` picks sharded or full files.
        accelerator: The ``Accelerator`` of the run.
        model: The FSDP-wrapped model.
        output_dir: Folder the files go to; created when missing.
        model_index: Index of the model among the prepared ones, used in the file names. Defaults to `0`.
    """
    os.makedirs(output_dir, exist_ok=True)
    if _sharded(fsdp_plugin):
        path = os.path.join(output_dir, ckpt.sharded_model_dir(model_index))
        fsdp_state.save_sharded_model(_inner(model), path, local=_local(fsdp_plugin))
        return path
    weights = fsdp_state.full_model_state_dict(_inner(model))
    path = os.path.join(output_dir, _model_file(model_index))
    if accelerator.is_main_process:
        from accel_train.checkpoint.file_io import save_weights

        save_weights(weights, path)
    accelerator.wait_for_everyone()
    return path


def load_fsdp_model(
    fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, input_dir: str, model_index: int = 0, **_: Any
) -> None:
    """Read what `save_fsdp_model()` wrote (a sharded folder or a full file) into ``model``.

    Args:
        fsdp_plugin: The ``FullyShardedDataParallelPlugin`` whose ``state_dict_type`` picks sharded or full files.
        accelerator: The ``Accelerator`` of the run.
        model: The FSDP-wrapped model to load into.
        input_dir: Folder the checkpoint was saved to.
        model_index: Index of the model among the prepared ones, used in the file names. Defaults to `0`.
    """
    folder = os.path.join(input_dir, ckpt.sharded_model_dir(model_index))
    if os.path.isdir(folder):
        fsdp_state.load_sharded_model(_inner(model), folder, local=_local(fsdp_plugin))
        return
    if os.path.isfile(os.path.join(input_dir, ".metadata")):
        fsdp_state.load_sharded_model(_inner(model), input_dir, local=_local(fsdp_plugin))
        return
    from accel_train.checkpoint.file_io import load_weights

    path = os.path.join(input_dir, _model_file(model_index))
    fsdp_state.load_full_model_state_dict(_inner(model), load_weights(path), source=path)


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    output_dir: str,
    optimizer_index: int = 0,
) -> str:
    """Write the optimizer's state: shards into ``optimizer_{index}``, or the full state into ``optimizer.bin``.

    Args:
        fsdp_plugin: The ``FullyShardedDataParallelPlugin`` whose ``state_dict_type`` picks sharded or full files.
        accelerator: The ``Accelerator`` of the run.
        optimizer: The optimizer of the sharded model.
        model: The FSDP-wrapped model the optimizer trains.
        output_dir: Folder the files go to.
        optimizer_index: Index of the optimizer among the prepared ones, used in the file names. Defaults to `0`.
    """
    os.makedirs(output_dir, exist_ok=True)
    if _sharded(fsdp_plugin):
        path = os.path.join(output_dir, ckpt.sharded_optimizer_dir(optimizer_index))
        fsdp_state.save_sharded_optimizer(_inner(model), unwrap_optimizer(optimizer), path)
        return path
    state = fsdp_state.full_optimizer_state_dict(_inner(model), unwrap_optimizer(optimizer))
    path = os.path.join(output_dir, _optimizer_file(optimizer_index))
    if accelerator.is_main_process:
        file_io.save_torch(state, path)
    accelerator.wait_for_everyone()
    return path


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: str,
    optimizer_index: int = 0,
    **_: Any,
) -> None:
    """Read what `save_fsdp_optimizer()` wrote into ``optimizer`` (of the sharded ``model``).

    Args:
        fsdp_plugin: The ``FullyShardedDataParallelPlugin`` whose ``state_dict_type`` picks sharded or full files.
        accelerator: The ``Accelerator`` of the run.
        optimizer: The optimizer to load into.
        model: The FSDP-wrapped model the optimizer trains.
        input_dir: Folder the checkpoint was saved to.
        optimizer_index: Index of the optimizer among the prepared ones, used in the file names. Defaults to `0`.
    """
    folder = os.path.join(input_dir, ckpt.sharded_optimizer_dir(optimizer_index))
    if os.path.isdir(folder):
        fsdp_state.load_sharded_optimizer(_inner(model), unwrap_optimizer(optimizer), folder)
        return
    from accel_train.checkpoint.file_io import load_torch

    state = load_torch(os.path.join(input_dir, _optimizer_file(optimizer_index)))
    fsdp_state.load_full_optimizer_state_dict(_inner(model), unwrap_optimizer(optimizer), state)


def get_fsdp2_grad_scaler(**kwargs: Any) -> Any:
    """The fp16 gradient scaler for FSDP2 (torch's ``ShardedGradScaler``: overflow checked on every
    rank's shards); ``kwargs`` are ``GradScaler``'s (``device`` defaults to this process's).

    Args:
        **kwargs: Keyword arguments of the gradient scaler (``init_scale``, ``growth_factor``, ``device`` ...).
    """
    from accel_train.strategies.fsdp.strategy import fsdp_grad_scaler

    device = kwargs.pop("device", None)
    if device is None:
        from accel_state.state import PartialState

        device = PartialState().device.type
    return fsdp_grad_scaler(str(device), **kwargs)


def _fsdp_strategy(accelerator: Any) -> Any:
    strategy = getattr(accelerator, "_strategy", None)
    if getattr(strategy, "name", None) != "fsdp":
        raise ValueError("this utility needs an Accelerator configured for FSDP (fsdp_plugin or accel launch FSDP)")
    return strategy


def fsdp2_prepare_model(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` with FSDP2 by the Accelerator's plugin (units, mixed precision, offload,
    RAM-efficient loading) and register it, as ``accelerator.prepare`` does for a model.

    Args:
        accelerator: The ``Accelerator`` whose FSDP plugin configures the sharding.
        model: The model to shard.
    """
    strategy = _fsdp_strategy(accelerator)
    if strategy.fsdp_version != 2:
        raise ValueError("fsdp2_prepare_model needs fsdp_version=2 in the FullyShardedDataParallelPlugin")
    return accelerator.prepare_model(model)  # type: ignore[no-any-return]


def fsdp2_load_full_state_dict(
    accelerator: Any, model: torch.nn.Module, full_state_dict: Mapping[str, torch.Tensor], strict: bool = False
) -> None:
    """Load a full state dict held by rank 0 (others may pass ``{}``) into the sharded ``model``:
    rank 0's tensors are broadcast and each rank keeps its shards.

    Args:
        accelerator: The ``Accelerator`` of the run.
        model: The FSDP2-sharded model.
        full_state_dict: The full state dict on rank 0 (`{}` on the others).
        strict: Whether missing or unexpected keys are errors. Defaults to `False`.
    """
    fsdp_state.load_full_model_state_dict(_inner(model), full_state_dict, strict=strict, broadcast_from_rank0=True)


def fsdp2_apply_ac(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap the plugin's layer classes (or the model's ``_no_split_modules``) in activation
    checkpointing, in place; returns the model.

    Args:
        accelerator: The ``Accelerator`` whose FSDP plugin names the layer classes.
        model: The model to wrap.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    plugin = accelerator.state.fsdp_plugin
    names = plugin.transformer_cls_names_to_wrap if plugin is not None else None
    classes = tuple(resolve_wrap_classes(model, names))
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, classes),
    )
    return model


def fsdp2_canonicalize_names(named_params: Mapping[str, Any]) -> dict[str, Any]:
    """``named_params`` with the prefixes of FSDP1, activation checkpointing and ``torch.compile``
    removed from the names (``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``, ``_orig_mod.``).

    Args:
        named_params: Parameters (or any values) keyed by their qualified names.
    """
    return {canonical_name(name): value for name, value in named_params.items()}


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: Mapping[Any, Any]) -> None:
    """Replace, in ``optimizer``'s groups, each parameter found in ``mapping`` (keyed by the parameter,
    its ``id`` or its ``data_ptr()``) by its sharded replacement.

    Args:
        optimizer: The optimizer whose parameter groups are updated in place.
        mapping: Old parameter (or its ``id`` / ``data_ptr()``) to the new, sharded parameter.
    """
    by_id = {(k if isinstance(k, int) else id(k)): v for k, v in mapping.items()}
    for group in optimizer.param_groups:
        new = []
        for param in group["params"]:
            replacement = by_id.get(id(param))
            if replacement is None and param.device.type != "meta":
                replacement = by_id.get(param.data_ptr())
            new.append(replacement if replacement is not None else param)
        group["params"] = new


def ensure_weights_retied(
    param_init_fn: Callable[[torch.nn.Module], Any] | None, model: torch.nn.Module, device: Any
) -> Callable[[torch.nn.Module], Any] | None:
    """A ``param_init_fn`` that re-ties the model's shared parameters after initialising a module
    (materialising meta tensors breaks the ties); ``param_init_fn`` itself when nothing is tied.

    Args:
        param_init_fn: The initialisation function to wrap, or `None`.
        model: The model whose tied parameters are found.
        device: Device the parameters are materialised on.
    """
    from accel_bigmodel.tied import find_tied_parameters

    tied = find_tied_parameters(model)
    if not tied:
        return param_init_fn
    owners: dict[int, list[tuple[torch.nn.Module, str, str]]] = {}
    modules = dict(model.named_modules())
    for group in tied:
        source = group[0]
        for name in group[1:]:
            module_name, _, attr = name.rpartition(".")
            owners.setdefault(id(modules[module_name]), []).append((modules[module_name], attr, source))

    def init_and_retie(module: torch.nn.Module) -> Any:
        result = param_init_fn(module) if param_init_fn is not None else module.to_empty(device=device, recurse=False)
        for owner, attr, source in owners.get(id(module), []):
            setattr(owner, attr, model.get_parameter(source))
        return result

    return init_and_retie


def get_parameters_from_modules(
    modules: Iterable[torch.nn.Module] | str | None, model: torch.nn.Module, device: Any
) -> set[torch.nn.Parameter]:
    """The parameters of ``modules``: what FSDP plugins take as modules to ignore or keep whole.

    TRL imports this name at module level, so it must exist whatever the backend.

    Args:
        modules: modules, or a regular expression matched in full against the names of ``model``'s
            submodules (the matched modules are moved to ``device``, as the documented system does);
            ``None`` gives the empty set.
        model: the model whose submodule names the expression is matched against.
        device: where modules found by name are moved.

    Returns:
        The set of their parameters (empty when nothing matched).
    """
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        found = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
        for module in found:
            module.to(device)
        modules = found
    return {param for module in modules for param in module.parameters()}


# The documented home of these names is ``accel_train.fsdp_utils`` (an alias of this very module, see
# ``accel_train.MOVED_MODULES``): that is where introspection and pickles find them.
for _name in __all__:
    globals()[_name].__module__ = "accel_train.fsdp_utils"
del _name

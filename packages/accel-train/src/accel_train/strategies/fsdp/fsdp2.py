"""The one FSDP2 path, used by the FSDP strategy and the ND-parallel strategy alike.

Every setting of `FullyShardedDataParallelPlugin` that FSDP2
knows means the same under both strategies because both call these functions, in torchtitan's fixed
order: (tensor parallelism, ND only) -> `apply_activation_checkpointing()` -> ``torch.compile`` ->
`shard_model()`. A plugin setting that has no meaning on an ND mesh is refused by name there
(`ND_REFUSED`).

- units: the plugin's auto-wrap policy (`wrap_units()`); without a
  plugin, the blocks of the model's repeated ``ModuleList`` s;
- activation checkpointing of the unit classes, offloaded to the CPU with
  ``activation_checkpointing_offload``; a checkpointed unit is sharded through its wrapper;
- ``fully_shard`` of each unit, then the root, with the plugin's ``reshard_after_forward``, its
  mixed-precision policy (or the precision's dtypes), CPU offload, ``ignored_modules``, and
  ``forward_prefetch`` (each unit prefetches the next in forward).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from accel_train.strategies.fsdp.wrap import (
    fsdp2_mixed_precision_policy,
    ignored_modules_of,
    resolve_wrap_classes,
    wrap_units,
)
from accel_train.wrappers import repeated_block_lists

__all__ = [
    "ND_REFUSED",
    "apply_activation_checkpointing",
    "checkpoint_parent",
    "gradient_sync",
    "is_quantized_parameter",
    "offload_wanted",
    "repeated_blocks",
    "restore_unsharded_gradients",
    "shard_model",
    "shard_units",
    "unsharded_gradients",
    "units_of_one_dtype",
    "upcast_to_float32",
    "warn_upcast",
]

logger = logging.getLogger(__name__)

#: FSDP plugin settings the ND strategy cannot honour: field -> why (refused by name when set).
ND_REFUSED: dict[str, str] = {
    "cpu_ram_efficient_loading": "the ND strategy places each rank's model before tensor parallelism splits it",
}


def offload_wanted(plugin: Any, device: torch.device) -> bool:
    """Whether the plugin asks for CPU offload of parameters; off, with a warning, when they already
    live on the CPU (no accelerator)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    offload = getattr(plugin, "cpu_offload", None)
    if isinstance(offload, OffloadPolicy):  # FSDP2's objects: OffloadPolicy() is "no offload"
        wanted = isinstance(offload, CPUOffloadPolicy)
    else:
        wanted = bool(getattr(offload, "offload_params", offload))
    if wanted and device.type == "cpu":
        logger.warning(
            "FSDP cpu_offload / offload_params has no effect here: the parameters already live on the CPU "
            "(no accelerator); training runs without offloading"
        )
        return False
    return wanted


def apply_activation_checkpointing(model: torch.nn.Module, plugin: Any) -> None:
    """Wrap the plugin's unit classes in activation checkpointing, in place.

    The classes are ``transformer_cls_names_to_wrap``, else the model's ``_no_split_modules``, else the
    classes of its repeated blocks; offloaded to the CPU with ``activation_checkpointing_offload``.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as apply,
    )

    names = getattr(plugin, "transformer_cls_names_to_wrap", None)
    blocks = repeated_blocks(model)
    if not names and not getattr(model, "_no_split_modules", None) and blocks:
        classes: tuple[type, ...] = tuple({type(block) for block in blocks})  # no names: the repeated blocks
    else:
        classes = tuple(resolve_wrap_classes(model, names))
    wrapper = (
        (lambda m: checkpoint_wrapper(m, offload_to_cpu=True))
        if getattr(plugin, "activation_checkpointing_offload", False)
        else (lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    )
    apply(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, classes))


def checkpoint_parent(root: torch.nn.Module, unit: torch.nn.Module) -> torch.nn.Module:
    """The activation-checkpoint wrapper around ``unit`` when there is one (sharded in its place)."""
    for module in root.modules():
        if type(module).__name__ == "CheckpointWrapper" and getattr(module, "_checkpoint_wrapped_module", None) is unit:
            return module
    return unit


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the model's ``ModuleList`` s of one block class (a transformer's layers)."""
    return [block for blocks in repeated_block_lists(model) for block in blocks]


def shard_units(model: torch.nn.Module, plugin: Any, default_blocks: bool = False) -> list[torch.nn.Module]:
    """The submodules sharded as their own units, children first (through their checkpoint wrappers).

    The plugin's ``auto_wrap_policy`` means the same under every strategy; without one (or without a
    plugin) the strategy's default applies: ``default_blocks`` shards the repeated blocks (ND), else
    the root only (FSDP, as documented).
    """
    if plugin is not None and getattr(plugin, "auto_wrap_policy", None) is not None:
        units = wrap_units(model, plugin)
    else:
        units = _outermost(repeated_blocks(model)) if default_blocks else []
    return [checkpoint_parent(model, unit) for unit in units]


def _outermost(units: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """``units`` without those nested in another (a list of experts inside each repeated block): an
    expert that no token of one rank reaches is not called there, so as a unit of its own its all-gather
    would run on some ranks only; inside its block it is gathered with the block, on every rank."""
    inside = {id(inner) for unit in units for inner in unit.modules() if inner is not unit}
    return [unit for unit in units if id(unit) not in inside]


def shard_model(
    model: torch.nn.Module,
    plugin: Any,
    *,
    mesh: Any,
    dtypes: tuple[Any, Any, Any],
    offload: bool,
    units: Sequence[torch.nn.Module] | None = None,
    expert_units: Sequence[torch.nn.Module] = (),
    expert_mesh: Any = None,
) -> torch.nn.Module:
    """``fully_shard`` each unit, then ``model``, with the plugin's FSDP2 settings; returns ``model``.

    Args:
        model: the model (after tensor parallelism, activation checkpointing and compile).
        plugin: the FSDP plugin, or ``None`` for the defaults (reshard after forward, no offload).
        mesh: the device mesh (or sub-mesh) to shard over.
        dtypes: the precision's ``(param, reduce, buffer)`` dtypes, for the mixed-precision policy.
        offload: offload parameters to the CPU (see `offload_wanted()`).
        units: the units (default `shard_units()`).
        expert_units: expert modules under expert parallelism (their parameters DTensors over ``ep``):
            sharded first, over ``expert_mesh``, or left alone by FSDP when ``expert_mesh`` is ``None`` (no
            other rank holds the same experts).
        expert_mesh: the mesh of the ranks holding the same experts (``dp_replicate`` x ``dp_shard``).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    units = list(units) if units is not None else shard_units(model, plugin)
    if dtypes[0] is not None:  # mixed precision: fp32 weights, low-precision compute
        upcast_to_float32(model)
    units = units_of_one_dtype(model, units)
    policy = getattr(plugin, "cpu_offload", None)
    if not isinstance(policy, OffloadPolicy) or (isinstance(policy, CPUOffloadPolicy) and not offload):
        policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": fsdp2_mixed_precision_policy(getattr(plugin, "mixed_precision_policy", None), dtypes),
        "offload_policy": policy,
    }
    reshard = getattr(plugin, "reshard_after_forward", None)
    if isinstance(reshard, bool):
        kwargs["reshard_after_forward"] = reshard
    ignored = {p for m in ignored_modules_of(model, getattr(plugin, "ignored_modules", None)) for p in m.parameters()}
    if expert_units and expert_mesh is None:
        ignored |= {p for m in expert_units for p in m.parameters()}
    if ignored:
        kwargs["ignored_params"] = ignored
    if expert_mesh is not None:
        for unit in expert_units:
            fully_shard(unit, **{**kwargs, "mesh": expert_mesh})
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    if getattr(plugin, "forward_prefetch", False) and len(units) > 1:
        for current, following in itertools.pairwise(units):
            current.set_modules_to_forward_prefetch([following])  # type: ignore[operator]
    return model


def upcast_to_float32(model: torch.nn.Module) -> list[str]:
    """Turn the low-precision floating-point parameters of ``model`` into float32, in place, and warn once
    naming them; returns their names.

    With mixed precision FSDP2 all-gathers the weights in the low precision and computes there, while the
    sharded weights, their gradients after reduction and the optimizer state stay float32 (as DeepSpeed
    keeps fp32 master weights). A model loaded in bf16 would otherwise keep bf16 master weights and lose
    every update smaller than bf16 resolves. Every parameter is looked at (not only the first: a model
    whose first parameter is an fp32 norm is upcast too), except quantized weights
    (`is_quantized_parameter()`): their bytes are packed 4-bit codes, which a cast would destroy.

    Args:
        model: the model, before ``fully_shard``.
    """
    upcast = []
    for name, param in model.named_parameters():
        if is_quantized_parameter(param):
            continue
        if param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.to(torch.float32)
            upcast.append(name)
    warn_upcast(upcast)
    return upcast


def is_quantized_parameter(param: torch.Tensor) -> bool:
    """True for a quantized weight: a bitsandbytes ``Params4bit``, or any parameter carrying a
    ``quant_state``.

    Such a weight may be stored in a floating dtype (``bnb_4bit_quant_storage=torch.bfloat16``, the layout
    that lets FSDP shard a 4-bit model, FSDP-QLoRA), but its elements are packed 4-bit codes, not numbers:
    casting them to float32 would break the quantized layer, so FSDP leaves them as they are. Recognised by
    class name and attribute, so bitsandbytes is not imported.

    Args:
        param: a parameter of the model.
    """
    return type(param).__name__ == "Params4bit" or getattr(param, "quant_state", None) is not None


def warn_upcast(names: Sequence[str]) -> None:
    """Warn once, naming (the first few of) the parameters FSDP upcast to float32 (nothing when none).

    Args:
        names: the parameters upcast, by name.
    """
    if not names:
        return
    import warnings

    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    warnings.warn(
        f"FSDP with mixed precision keeps float32 weights: upcast {len(names)} low-precision parameter(s) "
        f"({shown}) to float32; compute stays in the mixed-precision dtype, and checkpoints hold float32",
        UserWarning,
        stacklevel=4,
    )


def units_of_one_dtype(model: torch.nn.Module, units: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """``units`` plus, where a unit (or the root) would group trained parameters of several dtypes (fp32
    norms in a bf16 model), each module holding trained parameters of a dtype other than the unit's main
    one: FSDP2 needs one original dtype among a unit's trained parameters (frozen ones may differ).
    Returned children first.

    Args:
        model: the root module.
        units: the units chosen by the wrap policy, children first.

    Raises:
        ValueError: one module holds parameters of several dtypes itself (it cannot be split further).
    """
    roots = [*units, model]
    unit_ids = {id(unit) for unit in roots}
    extra: list[torch.nn.Module] = []
    for root in roots:
        owners: list[tuple[torch.nn.Module, str]] = []
        todo = [(root, "")]
        while todo:
            module, prefix = todo.pop()
            for child_name, child in module.named_children():
                if id(child) not in unit_ids:
                    todo.append((child, f"{prefix}{child_name}."))
            owners.append((module, prefix.rstrip(".") or type(module).__name__))
        sizes: dict[torch.dtype, int] = {}
        for module, _ in owners:
            for param in _trained(module):
                sizes[param.dtype] = sizes.get(param.dtype, 0) + param.numel()
        if len(sizes) < 2:
            continue
        main = max(sizes, key=lambda dtype: sizes[dtype])
        for module, name in owners:
            own = {param.dtype for param in _trained(module)}
            if len(own) > 1:
                raise ValueError(
                    f"FSDP2 needs one dtype per sharded unit, and module {name} ({type(module).__name__}) holds "
                    f"parameters of {sorted(str(d) for d in own)} itself; cast them to one dtype, or train with "
                    "mixed precision (the weights are then kept in float32)"
                )
            if own and own != {main} and module is not root:
                extra.append(module)
    if not extra:
        return list(units)
    depth = {id(module): name.count(".") + 1 if name else 0 for name, module in model.named_modules()}
    return sorted([*extra, *units], key=lambda module: -depth.get(id(module), 0))


def _trained(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters ``module`` holds itself that are trained: FSDP2 needs one dtype among those of a
    unit only (frozen ones, such as packed 4-bit weights beside a float32 bias, are gathered as bytes)."""
    return [param for param in module.parameters(recurse=False) if param.requires_grad]


def _fsdp2_parameters(models: Sequence[torch.nn.Module]) -> Iterator[tuple[str, Any]]:
    """``("<model index>.<parameter name>", FSDPParam)`` of every parameter FSDP2 manages in ``models``."""
    for index, model in enumerate(models):
        names = {id(param): name for name, param in model.named_parameters()}
        seen: set[int] = set()
        for module in model.modules():
            get_state = getattr(module, "_get_fsdp_state", None)
            group = getattr(get_state(), "_fsdp_param_group", None) if callable(get_state) else None
            for fsdp_param in getattr(group, "fsdp_params", None) or ():
                if id(fsdp_param) not in seen:
                    seen.add(id(fsdp_param))
                    yield f"{index}.{names.get(id(fsdp_param.sharded_param), fsdp_param._param_fqn)}", fsdp_param


#: suffix of a saved gradient that is this process's shard of ``param.grad`` (see unsharded_gradients)
SHARDED_GRAD_SUFFIX = "#sharded"


def unsharded_gradients(models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The gradients FSDP2 holds between two optimizer steps of gradient accumulation, per process.

    While gradient sync is off they stay unsharded on each process (its own micro-batches' sum), outside
    ``param.grad``. Where it stayed on (one process: accumulation does not turn it off, as there is
    nothing to synchronise with) each backward reduce-scattered into the sharded ``param.grad``: this
    process's shard is saved then, under the key with `SHARDED_GRAD_SUFFIX`.

    Args:
        models: the sharded models, in order.

    Raises:
        ValueError: a gradient is itself a DTensor (tensor parallelism): it cannot be saved per process.
    """
    grads: dict[str, torch.Tensor] = {}
    for key, fsdp_param in _fsdp2_parameters(models):
        grad = fsdp_param.unsharded_accumulated_grad
        if grad is None and hasattr(fsdp_param, "_unsharded_param"):
            grad = fsdp_param._unsharded_param.grad
        if grad is None:
            sharded = fsdp_param.sharded_param.grad
            if sharded is not None:
                grads[key + SHARDED_GRAD_SUFFIX] = sharded.to_local().detach()
            continue
        if hasattr(grad, "to_local"):
            raise ValueError(
                f"save_state between two optimizer steps of gradient accumulation is not supported with tensor "
                f"parallelism (the gradient gathered so far of {key.split('.', 1)[1]} is split over the tp "
                "dimension); call it after the optimizer step of a sync step (accelerator.sync_gradients is True)"
            )
        grads[key] = grad.detach()
    return grads


def restore_unsharded_gradients(models: Sequence[torch.nn.Module], grads: dict[str, torch.Tensor] | None) -> None:
    """Put back what `unsharded_gradients()` returned, where FSDP2 adds the next micro-batches'
    gradients and reduce-scatters the sum at the next sync step (``None``: no gradient).

    Args:
        models: the sharded models, in order.
        grads: the saved gradients, or ``None``.
    """
    for key, fsdp_param in _fsdp2_parameters(models):
        saved = None if grads is None else grads.get(key)
        if hasattr(fsdp_param, "_unsharded_param"):
            fsdp_param._unsharded_param.grad = None
        if saved is not None:
            dtype = fsdp_param.reduce_dtype or fsdp_param.orig_dtype
            saved = saved.to(device=fsdp_param.sharded_param.device, dtype=dtype).clone()
        fsdp_param.unsharded_accumulated_grad = saved
        shard = None if grads is None else grads.get(key + SHARDED_GRAD_SUFFIX)
        param = fsdp_param.sharded_param
        if shard is None:
            param.grad = None
            continue
        from torch.distributed.tensor import DTensor

        local = shard.to(device=param.device, dtype=param.dtype).clone()
        param.grad = DTensor.from_local(
            local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
        )


@contextlib.contextmanager
def gradient_sync(model: Any, enabled: bool) -> Iterator[None]:
    """Context in which an FSDP2 model reduces its gradients in backward (``enabled``) or keeps them local
    (gradient accumulation); the previous setting comes back on exit."""
    previous = getattr(model, "_accel_gradient_sync", True)
    model.set_requires_gradient_sync(enabled)
    model._accel_gradient_sync = enabled
    try:
        yield
    finally:
        model.set_requires_gradient_sync(previous)
        model._accel_gradient_sync = previous

"""Which submodules of a model FSDP wraps (shards) as units, and the torch policy objects of a plugin.

Pure logic over a module tree: no process group is needed. FSDP1 takes an ``auto_wrap_policy``
callable; FSDP2 (``fully_shard``) is applied to each unit bottom-up, then to the root, so both
versions get their units from the same rules:

========================  =======================================================================
policy                    units
========================  =======================================================================
TRANSFORMER_BASED_WRAP    every submodule whose class name is in ``transformer_cls_names_to_wrap``
                          (else the model's ``_no_split_modules``)
SIZE_BASED_WRAP           the smallest submodules holding at least ``min_num_params`` parameters
                          not already in a unit; ``min_num_params=0``: none (no size-based
                          wrapping, as documented)
NO_WRAP / ``None``        none: the whole model is one unit
========================  =======================================================================
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = [
    "block_class_names",
    "canonical_name",
    "fsdp1_auto_wrap_policy",
    "fsdp2_mixed_precision_policy",
    "fsdp1_mixed_precision",
    "ignored_modules_of",
    "resolve_wrap_classes",
    "wrap_units",
]

#: Prefixes that wrappers insert into parameter names (FSDP1, activation checkpointing, compile).
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")

_DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def canonical_name(name: str) -> str:
    """``name`` without the prefixes FSDP1, activation checkpointing and ``torch.compile`` insert."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def block_class_names(model: torch.nn.Module) -> list[str]:
    """Class names of the model's own building blocks (not ``torch.nn`` layers), repeated ones first."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if module is model:
            continue
        cls = type(module)
        if cls.__module__.startswith("torch.nn") or cls.__module__.startswith("torch.distributed"):
            continue
        counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
    return sorted(counts, key=lambda name: (-counts[name], name))


def resolve_wrap_classes(model: torch.nn.Module, names: Iterable[str] | None) -> set[type]:
    """The module classes named in ``names`` (or in ``model._no_split_modules``).

    Raises ``ValueError`` naming each class that matches no submodule and listing the model's block
    classes, or when no names are given and the model has no ``_no_split_modules``.
    """
    names = list(names or [])
    if not names:
        names = list(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            "auto_wrap_policy=TRANSFORMER_BASED_WRAP needs the layer classes to wrap: set "
            "transformer_cls_names_to_wrap (fsdp_transformer_layer_cls_to_wrap) or give the model a "
            f"_no_split_modules list. Block classes of {type(model).__name__}: {block_class_names(model)}"
        )
    by_name: dict[str, type] = {}
    for module in model.modules():
        by_name.setdefault(type(module).__name__, type(module))
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ValueError(
            f"transformer layer class(es) {missing} to wrap match no module of {type(model).__name__}; "
            f"its block classes are {block_class_names(model)}"
        )
    return {by_name[name] for name in names}


def _policy_name(plugin: Any) -> str | None:
    policy = plugin.auto_wrap_policy
    if policy is None or callable(policy):
        return None
    return str(policy)


def _size_units(model: torch.nn.Module, min_num_params: int) -> list[torch.nn.Module]:
    """Bottom-up: a submodule becomes a unit when the parameters not yet in a unit reach the threshold.
    A threshold of 0 means no size-based wrapping (the documented meaning), not a unit per module."""
    units: list[torch.nn.Module] = []
    if min_num_params <= 0:
        return units

    def visit(module: torch.nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            remaining += visit(child)
        if module is not model and remaining >= min_num_params and remaining > 0:
            units.append(module)
            return 0
        return remaining

    visit(model)
    return units


def wrap_units(model: torch.nn.Module, plugin: Any) -> list[torch.nn.Module]:
    """The submodules to shard as their own units, children before parents (the root excluded)."""
    policy = plugin.auto_wrap_policy
    torch_policy = _torch_policy_units(model, policy)
    if torch_policy is not None:
        return torch_policy
    if callable(policy) and not isinstance(policy, str):
        # A user policy for FSDP2: a callable module -> bool.
        return [m for m in _post_order(model) if m is not model and policy(m)]
    name = _policy_name(plugin)
    if name in (None, "NO_WRAP"):
        return []
    if name == "TRANSFORMER_BASED_WRAP":
        classes = tuple(resolve_wrap_classes(model, plugin.transformer_cls_names_to_wrap))
        return [m for m in _post_order(model) if m is not model and isinstance(m, classes)]
    if name == "SIZE_BASED_WRAP":
        return _size_units(model, int(plugin.min_num_params or 0))
    raise ValueError(f"unknown auto_wrap_policy {name!r}")


def _torch_policy_units(model: torch.nn.Module, policy: Any) -> list[torch.nn.Module] | None:
    """The units of one of torch's FSDP1 policies (what `set_auto_wrap_policy` stores: a
    ``functools.partial`` of ``transformer_auto_wrap_policy`` or ``size_based_auto_wrap_policy``, or a
    ``ModuleWrapPolicy``), so FSDP2 shards as FSDP1 would wrap; ``None`` for any other policy."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy, transformer_auto_wrap_policy

    if isinstance(policy, ModuleWrapPolicy):
        classes = tuple(policy._module_classes)
    elif isinstance(policy, functools.partial) and policy.func is transformer_auto_wrap_policy:
        classes = tuple(policy.keywords.get("transformer_layer_cls") or ())
    elif isinstance(policy, functools.partial) and policy.func is size_based_auto_wrap_policy:
        return _size_units(model, int(policy.keywords.get("min_num_params", 0)))
    else:
        return None
    return [m for m in _post_order(model) if m is not model and isinstance(m, classes)]


def _post_order(model: torch.nn.Module) -> list[torch.nn.Module]:
    order: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            visit(child)
        order.append(module)

    visit(model)
    return order


def fsdp1_auto_wrap_policy(model: torch.nn.Module, plugin: Any) -> Callable[..., Any] | None:
    """The ``auto_wrap_policy`` argument of FSDP1 for ``plugin`` (``None``: one unit).

    As documented, a ``functools.partial`` of torch's policy function, whose ``func`` and ``keywords``
    scripts inspect: ``transformer_auto_wrap_policy`` with ``transformer_layer_cls`` (a set of classes),
    or ``size_based_auto_wrap_policy`` with ``min_num_params``; ``min_num_params=0`` is no size-based
    wrapping (``None``).
    """
    policy = plugin.auto_wrap_policy
    if callable(policy) and not isinstance(policy, str):
        return policy  # type: ignore[no-any-return]
    name = _policy_name(plugin)
    if name in (None, "NO_WRAP"):
        return None
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    if name == "TRANSFORMER_BASED_WRAP":
        classes = set(resolve_wrap_classes(model, plugin.transformer_cls_names_to_wrap))
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    min_num_params = int(plugin.min_num_params or 0)
    if min_num_params <= 0:
        return None
    return functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params)


def ignored_modules_of(model: torch.nn.Module, ignored: Any) -> list[torch.nn.Module]:
    """The modules of ``model`` that FSDP leaves alone: given as modules, or as a regular expression
    over submodule names."""
    if ignored is None:
        return []
    if isinstance(ignored, str):
        import re

        pattern = re.compile(ignored)
        found = [module for name, module in model.named_modules() if name and pattern.fullmatch(name)]
        if not found:
            raise ValueError(f"ignored_modules={ignored!r} matches no submodule name of {type(model).__name__}")
        return found
    modules = list(ignored)
    own = {id(m) for m in model.modules()}
    strangers = [type(m).__name__ for m in modules if id(m) not in own]
    if strangers:
        raise ValueError(f"ignored_modules holds modules that are not part of the model: {strangers}")
    return modules


def _dtype(value: Any, field: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
    raise ValueError(f"mixed_precision_policy {field}={value!r} is not a dtype; use one of {sorted(_DTYPE_NAMES)}")


def _explicit_dtypes(policy: Any) -> dict[str, Any] | None:
    if policy is None:
        return None
    if isinstance(policy, str):
        dtype = _dtype(policy, "policy")
        return {"param_dtype": dtype, "reduce_dtype": dtype, "buffer_dtype": dtype}
    if isinstance(policy, dict):
        allowed = {"param_dtype", "reduce_dtype", "buffer_dtype", "output_dtype", "cast_forward_inputs"}
        unknown = sorted(set(policy) - allowed)
        if unknown:
            raise ValueError(f"mixed_precision_policy has unknown keys {unknown}; valid: {sorted(allowed)}")
        return {k: (v if k == "cast_forward_inputs" else _dtype(v, k)) for k, v in policy.items()}
    return None


def fsdp1_mixed_precision(plugin_policy: Any, dtypes: tuple[Any, Any, Any]) -> Any:
    """FSDP1 ``MixedPrecision`` from the plugin's explicit policy, else from the precision's dtypes."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if isinstance(plugin_policy, MixedPrecision):
        return plugin_policy
    if isinstance(plugin_policy, MixedPrecisionPolicy):
        raise ValueError(
            "mixed_precision_policy is an FSDP2 MixedPrecisionPolicy but fsdp_version=1; give a "
            "torch.distributed.fsdp.MixedPrecision (or a dict of dtypes)"
        )
    explicit = _explicit_dtypes(plugin_policy)
    if explicit is not None:
        explicit.pop("output_dtype", None)
        return MixedPrecision(**explicit)
    if plugin_policy is not None:
        raise TypeError(
            f"mixed_precision_policy must be a MixedPrecision, a dict or a dtype name, got {plugin_policy!r}"
        )
    param, reduce, buffer = dtypes
    if param is None and reduce is None and buffer is None:
        return None
    return MixedPrecision(param_dtype=param, reduce_dtype=reduce, buffer_dtype=buffer)


def fsdp2_mixed_precision_policy(plugin_policy: Any, dtypes: tuple[Any, Any, Any]) -> Any:
    """FSDP2 ``MixedPrecisionPolicy`` from the plugin's explicit policy, else from the precision's dtypes.

    From the dtypes (or one dtype name) the policy casts parameters, gradient reductions and the root's
    outputs to the same dtype (``output_dtype`` too, as the documented plugin sets it); a dict or
    torch's object is taken as given.
    """
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if isinstance(plugin_policy, MixedPrecisionPolicy):
        return plugin_policy
    if isinstance(plugin_policy, MixedPrecision):
        raise ValueError(
            "mixed_precision_policy is an FSDP1 MixedPrecision but fsdp_version=2; give a "
            "torch.distributed.fsdp.MixedPrecisionPolicy (or a dict of dtypes)"
        )
    explicit = _explicit_dtypes(plugin_policy)
    if explicit is not None:
        buffer = explicit.pop("buffer_dtype", None)  # FSDP2 does not cast buffers
        if isinstance(plugin_policy, str):
            explicit["output_dtype"] = buffer  # one dtype name: the forward's outputs too
        return MixedPrecisionPolicy(**explicit)
    if plugin_policy is not None:
        raise TypeError(
            f"mixed_precision_policy must be a MixedPrecisionPolicy, a dict or a dtype name, got {plugin_policy!r}"
        )
    param, reduce, _ = dtypes
    # As the documented plugin builds it from mixed_precision: the outputs come back in the parameters' dtype.
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce, output_dtype=param)

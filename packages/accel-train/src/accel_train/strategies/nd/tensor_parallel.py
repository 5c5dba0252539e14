"""Tensor-parallel plans: which module is split how, resolved against a model and applied with DTensor.

A plan maps module names to a style. Names may hold ``*`` for one name component (so
``layers.*.mlp.up`` matches every block's ``up`` projection), as in the ``tp_plan`` / ``_tp_plan``
attribute that transformers models carry. Styles are torch ``ParallelStyle`` objects or the names
transformers models ship:

=========================  ================================================================================
``colwise``                 split the weight's output features; outputs stay sharded on the last dim
``rowwise``                 split the weight's input features; outputs are summed (replicated)
``colwise_rep``             ``colwise`` whose outputs are gathered (replicated) again
``colwise_gather_output``   the same as ``colwise_rep`` (transformers' name, e.g. for ``lm_head``)
``rowwise_rep``             ``rowwise`` taking replicated inputs
``rowwise_split_input``     the same as ``rowwise_rep`` (transformers' name)
``embedding_rowwise``       an embedding split over the vocabulary; lookups are summed (replicated)
``embedding_colwise``       an embedding split over the hidden size; vectors are gathered (replicated)
``sequence_parallel``       norm / dropout layers run on sequence shards
``replicate``               the module stays whole on every rank
=========================  ================================================================================

The other styles of transformers (`REFUSED_STYLES`: fused ``packed_*`` projections, MoE experts,
MLA projections, ...) need sharding rules torch's styles do not express; a plan holding one is refused
with the reason, before anything is split.

`resolve_plan()` is pure (no process group); `apply_plan()` calls torch's
``parallelize_module`` over the tensor-parallel mesh.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["REFUSED_STYLES", "STYLE_NAMES", "apply_plan", "model_plan", "resolve_plan"]

STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
    "sequence_parallel",
    "replicate",
)

#: transformers' styles accel cannot apply with torch's parallel styles, and why.
REFUSED_STYLES: dict[str, str] = {
    "packed_colwise": "a fused projection (e.g. gate_up_proj) must be split per packed part, which torch's "
    "ColwiseParallel does not do",
    "packed_rowwise": "a fused projection must be split per packed part, which torch's RowwiseParallel does not do",
    "replicated_with_grad_allreduce": "its gradient is partial per rank and needs an all-reduce over the "
    "tensor-parallel group that accel does not install",
    "all_reduce": "it sums a module's partial outputs with a hook specific to transformers' MoE layers",
    "mla_kv_a_proj": "multi-head latent attention splits its projection into KV and RoPE parts, a rule "
    "specific to transformers' MLA layers",
    "moe_tp_experts": "expert weights are split per expert by transformers' MoE implementation (split the experts "
    "over processes with ParallelismConfig(ep_size=...) instead)",
    "moe_identity_expert": "it belongs to transformers' MoE expert parallelism (accel's is ParallelismConfig(ep_size=...))",
    "local_params": "the parameters are kept as per-rank local tensors by transformers' own hooks",
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in name.split(".")) + "$")


def model_plan(model: torch.nn.Module, explicit: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The plan to use: the explicit one, else the model's ``tp_plan`` / ``_tp_plan`` attribute."""
    if explicit:
        return dict(explicit)
    for attribute in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attribute, None)
        if isinstance(plan, Mapping) and plan:
            return dict(plan)
    return None


def resolve_plan(model: torch.nn.Module, plan: Mapping[str, Any] | None, tp_size: int) -> dict[str, Any]:
    """``{module name: style}`` for every module of ``model`` that ``plan`` names.

    Raises when there is no plan, when an entry matches no module, when a style is unknown, or when a
    split dimension does not divide by ``tp_size``; each error says what to change.
    """
    if not plan:
        raise ValueError(
            f"tensor parallelism (tp_size={tp_size}) needs a plan for {type(model).__name__}: which modules to "
            "split and how. Set `model.tp_plan = {'layers.*.up': 'colwise', 'layers.*.down': 'rowwise'}` (module "
            "names, '*' for one name component) or pass TorchTensorParallelConfig(tp_plan=...) as "
            "ParallelismConfig(tp_handler=...)"
        )
    modules = dict(model.named_modules())
    resolved: dict[str, Any] = {}
    for name, style in plan.items():
        if isinstance(style, str) and style in REFUSED_STYLES:
            raise ValueError(
                f"tp_plan[{name!r}] = {style!r} (a transformers style) is not supported by accel's tensor "
                f"parallelism: {REFUSED_STYLES[style]}. Give a plan without it (TorchTensorParallelConfig(tp_plan=...)) "
                f"using {list(STYLE_NAMES)}, or a torch ParallelStyle object for that module"
            )
        if isinstance(style, str) and style not in STYLE_NAMES:
            raise ValueError(f"tp_plan[{name!r}] = {style!r} is not a known style; choose one of {list(STYLE_NAMES)}")
        pattern = _pattern(name)
        matched = [module_name for module_name in modules if module_name and pattern.match(module_name)]
        if not matched:
            linear = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)][:12]
            raise ValueError(
                f"tp_plan entry {name!r} matches no module of {type(model).__name__}; its linear layers are "
                f"{linear}{' ...' if len(linear) == 12 else ''}"
            )
        for module_name in matched:
            _check_divisible(module_name, modules[module_name], style, tp_size)
            resolved[module_name] = style
    return resolved


def _check_divisible(name: str, module: torch.nn.Module, style: Any, tp_size: int) -> None:
    if not isinstance(module, torch.nn.Linear) or not isinstance(style, str):
        return
    if style.startswith("colwise") and module.out_features % tp_size:
        raise ValueError(
            f"{name} has {module.out_features} output features, which do not split into tp_size={tp_size} "
            "equal parts ('colwise' splits output features)"
        )
    if style.startswith("rowwise") and module.in_features % tp_size:
        raise ValueError(
            f"{name} has {module.in_features} input features, which do not split into tp_size={tp_size} "
            "equal parts ('rowwise' splits input features)"
        )


def _style(style: Any) -> Any:
    if not isinstance(style, str):
        return style
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    if style in ("colwise_rep", "colwise_gather_output"):
        return ColwiseParallel(output_layouts=Replicate())
    if style in ("rowwise_rep", "rowwise_split_input"):
        return RowwiseParallel(input_layouts=Replicate())
    if style == "embedding_rowwise":  # token ids replicated; torch shards nn.Embedding's vocabulary (dim 0)
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if style == "embedding_colwise":  # nn.Embedding's hidden dim (dim 1), vectors gathered
        return ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    return SequenceParallel()


def apply_plan(model: torch.nn.Module, plan: Mapping[str, Any], tp_mesh: Any) -> torch.nn.Module:
    """Split the modules of a resolved ``plan`` over ``tp_mesh`` (parameters become DTensors)."""
    from torch.distributed.tensor.parallel import parallelize_module

    styles = {name: _style(style) for name, style in plan.items() if style != "replicate"}
    if styles:
        parallelize_module(model, tp_mesh, styles)
    return model

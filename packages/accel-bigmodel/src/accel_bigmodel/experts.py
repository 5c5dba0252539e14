"""Finding the expert blocks of a mixture-of-experts model: the one contract expert parallelism and the
memory estimator share.

An **expert module** is an ``nn.Module`` that

- has an integer attribute ``num_experts`` (> 0);
- is called as ``experts(hidden_states, top_k_index, top_k_weights)``: ``hidden_states`` is
  ``[tokens, hidden]``, ``top_k_index`` and ``top_k_weights`` are ``[tokens, k]``, and it returns
  ``[tokens, hidden]``, each token's sum over its ``k`` choices of ``weight x expert(token)``;
- holds its experts either **stacked** — every parameter directly on the module has ``num_experts`` as
  its first dimension (transformers' ``*Experts`` modules: ``gate_up_proj``, ``down_proj`` and biases) —
  or as a **list**: an ``nn.ModuleList`` attribute of ``num_experts`` modules, and no parameter of its own.

Its forward reads the experts only through ``self.num_experts`` and those parameters (or that list), so a
process may run it over a slice of the experts. A router (``num_experts`` too, but called with the hidden
states alone) is not an expert module. Pure logic: nothing here talks to processes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

from torch import nn

__all__ = ["ExpertModule", "expert_parameter_names", "find_expert_modules"]


@dataclass(frozen=True)
class ExpertModule:
    """One expert module of a model.

    Attributes:
        name: its qualified name in the model (``model.layers.0.mlp.experts``).
        num_experts: how many experts it holds.
        layout: ``stacked`` (parameters ``[num_experts, ...]``) or ``list`` (an ``nn.ModuleList``).
        parameters: the qualified names of its expert parameters (all of them: stacked tensors, or every
            parameter of every listed expert).
        list_name: the attribute holding the ``nn.ModuleList`` (``list`` layout), else ``""``.
    """

    name: str
    num_experts: int
    layout: Literal["stacked", "list"]
    parameters: tuple[str, ...]
    list_name: str = ""

    @property
    def list_prefix(self) -> str:
        """The qualified-name prefix of the listed experts (``model.layers.0.mlp.experts.experts.``), or
        ``""`` for stacked experts."""
        if not self.list_name:
            return ""
        return f"{self.name}.{self.list_name}." if self.name else f"{self.list_name}."


def _takes_routing(module: nn.Module) -> bool:
    """Whether ``module``'s forward takes three positional arguments (hidden states, indices, weights)."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
    return len(positional) >= 3 or variadic


def _as_expert_module(name: str, module: nn.Module) -> ExpertModule | None:
    count = getattr(module, "num_experts", None)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1 or not _takes_routing(module):
        return None
    prefix = f"{name}." if name else ""
    own = list(module.named_parameters(recurse=False))
    if own:
        if all(p.dim() >= 1 and p.shape[0] == count for _, p in own):
            return ExpertModule(name, count, "stacked", tuple(prefix + n for n, _ in own))
        return None
    for child_name, child in module.named_children():
        if isinstance(child, nn.ModuleList) and len(child) == count:
            names = tuple(f"{prefix}{child_name}.{n}" for n, _ in child.named_parameters())
            return ExpertModule(name, count, "list", names, list_name=child_name)
    return None


def find_expert_modules(model: nn.Module) -> list[ExpertModule]:
    """Every expert module of ``model`` (see the module's contract), outermost first; nested ones are not
    looked into.

    Args:
        model: the model (on any device, the meta device included).
    """
    found: list[ExpertModule] = []
    inside: list[str] = []  # prefixes of the submodules of expert modules found ("" when the model is one)
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in inside):
            continue
        expert = _as_expert_module(name, module)
        if expert is not None:
            found.append(expert)
            inside.append(f"{name}." if name else "")
    return found


def expert_parameter_names(model: nn.Module) -> set[str]:
    """The qualified names of every expert parameter of ``model``.

    Args:
        model: the model.
    """
    return {name for expert in find_expert_modules(model) for name in expert.parameters}

"""``accel_bigmodel.experts``: which modules of a model are expert modules, and their parameters."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from moe_models import (
    NUM_EXPERTS,
    ListExperts,
    Router,
    StackedExperts,
    UserMoe,
    build_dense,
    build_list_moe,
    build_stacked_moe,
    build_transformers_moe,
)
from torch import nn

from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.experts import ExpertModule, expert_parameter_names, find_expert_modules

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)

#: The stacked parameters of transformers' expert modules, per model.
TRANSFORMERS_EXPERT_PARAMETERS = {
    "qwen3_moe": ("gate_up_proj", "down_proj"),
    "mixtral": ("gate_up_proj", "down_proj"),
    "gpt_oss": ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"),
}


@needs_transformers
@pytest.mark.parametrize("kind", sorted(TRANSFORMERS_EXPERT_PARAMETERS))
def test_transformers_expert_modules_are_found_and_their_routers_are_not(kind: str) -> None:
    model = build_transformers_moe(kind)
    found = find_expert_modules(model)
    assert [e.name for e in found] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    for expert in found:
        assert expert.num_experts == NUM_EXPERTS and expert.layout == "stacked" and expert.list_name == ""
        assert expert.list_prefix == ""
        local = tuple(name.removeprefix(expert.name + ".") for name in expert.parameters)
        assert sorted(local) == sorted(TRANSFORMERS_EXPERT_PARAMETERS[kind])
        shapes = {name: model.get_parameter(name).shape for name in expert.parameters}
        assert all(shape[0] == NUM_EXPERTS for shape in shapes.values())
    routers = [n for n, m in model.named_modules() if n.endswith(("mlp.gate", "mlp.router"))]
    assert len(routers) == 2  # they exist, with num_experts and a [num_experts, hidden] weight ...
    assert all(getattr(model.get_submodule(n), "num_experts", None) == NUM_EXPERTS for n in routers)
    assert not set(routers) & {e.name for e in found}  # ... and are not expert modules
    names = expert_parameter_names(model)
    assert not any(".gate." in n or ".router." in n or "attn" in n for n in names)
    assert names == {n for e in found for n in e.parameters}


def test_a_user_stacked_block_is_found_with_every_stacked_parameter() -> None:
    with init_empty_weights():
        model = build_stacked_moe()
    assert find_expert_modules(model) == [
        ExpertModule(
            f"blocks.{i}.experts",
            NUM_EXPERTS,
            "stacked",
            tuple(f"blocks.{i}.experts.{p}" for p in ("up", "down", "up_bias")),
        )
        for i in range(2)
    ]


def test_a_user_list_block_is_found_with_every_parameter_of_every_expert() -> None:
    with init_empty_weights():
        model = build_list_moe()
    found = find_expert_modules(model)
    assert [(e.name, e.num_experts, e.layout, e.list_name) for e in found] == [
        (f"blocks.{i}.experts", NUM_EXPERTS, "list", "mlps") for i in range(2)
    ]
    expected = {
        f"blocks.{i}.experts.mlps.{e}.{layer}.{kind}"
        for i in range(2)
        for e in range(NUM_EXPERTS)
        for layer in (0, 2)
        for kind in ("weight", "bias")
    }
    assert set(found[0].parameters) | set(found[1].parameters) == expected == expert_parameter_names(model)
    assert [e.list_prefix for e in found] == ["blocks.0.experts.mlps.", "blocks.1.experts.mlps."]
    assert all(name.startswith(found[0].list_prefix) for name in found[0].parameters)


def test_a_dense_model_has_no_expert_module() -> None:
    model = build_dense()
    assert find_expert_modules(model) == []
    assert expert_parameter_names(model) == set()


def test_a_router_alone_is_not_an_expert_module() -> None:
    assert find_expert_modules(Router()) == []


class _Mismatched(StackedExperts):
    """Says it holds 4 experts, but one of its own parameters is not ``[4, ...]``."""

    def __init__(self) -> None:
        super().__init__(NUM_EXPERTS)
        self.scale = nn.Parameter(torch.ones(NUM_EXPERTS + 1))


class _OwnParameterAndList(ListExperts):
    """A list of 4 experts, but with a parameter of its own that is not ``[4, ...]``."""

    def __init__(self) -> None:
        super().__init__(NUM_EXPERTS)
        self.temperature = nn.Parameter(torch.ones(1))


@pytest.mark.parametrize("experts", [_Mismatched, _OwnParameterAndList], ids=["stacked", "list"])
def test_an_own_parameter_without_num_experts_first_is_not_an_expert_module(experts: type[nn.Module]) -> None:
    model = UserMoe([experts()])
    assert find_expert_modules(model) == []


def test_a_list_of_another_length_is_not_an_expert_module() -> None:
    experts = ListExperts(NUM_EXPERTS)
    experts.num_experts = NUM_EXPERTS + 1  # the list holds 4, the module says 5
    assert find_expert_modules(UserMoe([experts])) == []


@pytest.mark.parametrize("count", [0, True, 4.0, "4"])
def test_num_experts_must_be_a_positive_int(count: object) -> None:
    experts = StackedExperts(NUM_EXPERTS)
    experts.num_experts = count  # type: ignore[assignment]
    assert find_expert_modules(experts) == []


def test_an_expert_module_passed_as_the_model_is_found_and_not_looked_into() -> None:
    outer = ListExperts(2)
    outer.mlps = nn.ModuleList([StackedExperts(2), StackedExperts(2)])  # experts that are expert modules
    found = find_expert_modules(outer)
    assert [(e.name, e.layout, e.list_name) for e in found] == [("", "list", "mlps")]
    assert found[0].parameters[0] == "mlps.0.up" and found[0].list_prefix == "mlps."
    assert find_expert_modules(UserMoe([outer]))[0].name == "blocks.0.experts"
    assert len(find_expert_modules(UserMoe([outer]))) == 1

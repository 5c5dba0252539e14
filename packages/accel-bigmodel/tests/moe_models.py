"""Small mixture-of-experts models shared by the expert and estimate tests: transformers' own (from tiny
configs, no download) and user-defined blocks of both expert layouts (stacked tensors, a list of MLPs).

The ``build_*`` functions are ``package.module:factory`` targets for ``accel estimate-memory``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

HIDDEN = 16
EXPERT_WIDTH = 8
NUM_EXPERTS = 4

#: Tiny configs of transformers' mixture-of-experts models: (config class, model class, keyword arguments).
TRANSFORMERS_MOE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"moe_intermediate_size": EXPERT_WIDTH, "num_experts": NUM_EXPERTS, "decoder_sparse_step": 1},
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": NUM_EXPERTS}),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {"num_local_experts": NUM_EXPERTS, "layer_types": ["full_attention", "sliding_attention"]},
    ),
}


def transformers_moe_config(kind: str) -> Any:
    """A two-layer transformers config of ``kind`` (a key of `TRANSFORMERS_MOE`) with `NUM_EXPERTS` experts."""
    import transformers

    config_class, model_class, extra = TRANSFORMERS_MOE[kind]
    common = {
        "vocab_size": 64,
        "hidden_size": HIDDEN,
        "intermediate_size": EXPERT_WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "num_experts_per_tok": 2,
        "architectures": [model_class],
    }
    return getattr(transformers, config_class)(**common, **extra)


def build_transformers_moe(kind: str) -> nn.Module:
    """The causal-LM model of ``kind`` on the meta device."""
    import transformers

    from accel_bigmodel.empty import init_empty_weights

    config = transformers_moe_config(kind)
    with init_empty_weights():
        return getattr(transformers, config.architectures[0])(config)


def _route(
    hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, expert: Any, count: int
) -> torch.Tensor:
    """Each token's weighted sum over its chosen experts; ``expert(e, tokens)`` runs expert ``e``."""
    out = torch.zeros_like(hidden)
    for e in range(count):
        token, slot = (top_k_index == e).nonzero(as_tuple=True)
        if token.numel():
            out.index_add_(0, token, expert(e, hidden[token]) * top_k_weights[token, slot, None])
    return out


class StackedExperts(nn.Module):
    """A user's expert module of the stacked layout: every parameter is ``[num_experts, ...]``."""

    def __init__(self, num_experts: int = NUM_EXPERTS, bias: bool = True) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.up = nn.Parameter(torch.randn(num_experts, HIDDEN, EXPERT_WIDTH))
        self.down = nn.Parameter(torch.randn(num_experts, EXPERT_WIDTH, HIDDEN))
        self.up_bias = nn.Parameter(torch.zeros(num_experts, EXPERT_WIDTH)) if bias else None

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        def expert(e: int, x: torch.Tensor) -> torch.Tensor:
            up = x @ self.up[e] + (self.up_bias[e] if self.up_bias is not None else 0)
            return torch.relu(up) @ self.down[e]

        return _route(hidden, top_k_index, top_k_weights, expert, self.num_experts)


class ListExperts(nn.Module):
    """A user's expert module of the list layout: an ``nn.ModuleList`` of ``num_experts`` MLPs."""

    def __init__(self, num_experts: int = NUM_EXPERTS) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(HIDDEN, EXPERT_WIDTH), nn.ReLU(), nn.Linear(EXPERT_WIDTH, HIDDEN))
            for _ in range(num_experts)
        )

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return _route(hidden, top_k_index, top_k_weights, lambda e, x: self.mlps[e](x), self.num_experts)


class Router(nn.Module):
    """Chooses ``k`` experts per token; has ``num_experts`` and a ``[num_experts, hidden]`` weight, but is
    called with the hidden states alone, so it is no expert module."""

    def __init__(self, num_experts: int = NUM_EXPERTS, k: int = 2) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.k = k
        self.weight = nn.Parameter(torch.randn(num_experts, HIDDEN))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, index = torch.topk(torch.softmax(hidden @ self.weight.T, dim=-1), self.k, dim=-1)
        return index, weights


class MoeBlock(nn.Module):
    """A router and its experts."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        self.router = Router(experts.num_experts)
        self.experts = experts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        index, weights = self.router(hidden)
        return hidden + self.experts(hidden, index, weights)


class UserMoe(nn.Module):
    """Embedding, one dense layer, ``len(blocks)`` mixture-of-experts blocks and a head."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, HIDDEN)
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.blocks = nn.ModuleList(MoeBlock(experts) for experts in blocks)
        self.head = nn.Linear(HIDDEN, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.dense(self.embed(ids))
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def build_stacked_moe() -> nn.Module:
    """Two blocks of stacked experts (4 each)."""
    return UserMoe([StackedExperts(), StackedExperts()])


def build_list_moe() -> nn.Module:
    """Two blocks of listed experts (4 each)."""
    return UserMoe([ListExperts(), ListExperts()])


def build_uneven_moe() -> nn.Module:
    """A block of 4 stacked experts, then a block of 6 listed ones: only 1 and 2 divide both counts."""
    return UserMoe([StackedExperts(4), ListExperts(6)])


def build_dense() -> nn.Module:
    """No expert module at all."""
    return nn.Sequential(nn.Embedding(32, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 32))

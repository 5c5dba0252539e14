"""Tensor parallelism with the plan styles transformers models ship: every style of a stock model's
``tp_plan`` is applied or refused by name with the reason; a stock transformers Llama built from a
config, split by its own plan over 2 gloo processes, computes what the dense model computes."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.strategies.nd.tensor_parallel import REFUSED_STYLES, STYLE_NAMES, model_plan, resolve_plan

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers (nox -s clients)"
)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_transformers_style_names_are_known_or_refused_with_the_reason() -> None:
    for style in ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel", "embedding_rowwise"):
        assert style in STYLE_NAMES
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4))
    plan = resolve_plan(model, {"0": "embedding_rowwise", "1": "colwise_gather_output"}, tp_size=2)
    assert plan == {"0": "embedding_rowwise", "1": "colwise_gather_output"}
    with pytest.raises(ValueError, match=r"'packed_colwise' \(a transformers style\) is not supported.*fused"):
        resolve_plan(model, {"1": "packed_colwise"}, tp_size=2)
    assert "moe_tp_experts" in REFUSED_STYLES and not set(REFUSED_STYLES) & set(STYLE_NAMES)


@needs_transformers
def test_a_stock_llama_plan_resolves() -> None:
    model = _llama()
    plan = resolve_plan(model, model_plan(model), tp_size=2)
    assert plan["model.embed_tokens"] == "embedding_rowwise" and plan["lm_head"] == "colwise_gather_output"
    assert plan["model.layers.1.self_attn.o_proj"] == "rowwise"


def rank_llama_tp() -> dict:
    reset_shared_state()
    from accel_train import Accelerator
    from accel_train.parallelism_config import ParallelismConfig

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    model = _llama()
    dense = _llama()
    dense.load_state_dict(model.state_dict())
    model = accelerator.prepare(model)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids)
    ref = dense(input_ids=ids, labels=ids)
    out.loss.backward()
    ref.loss.backward()
    dense_params = dict(dense.named_parameters())
    full = {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in model.named_parameters()
    }
    return {
        "logits_diff": (out.logits - ref.logits).abs().max().item(),
        "loss_diff": abs(out.loss.item() - ref.loss.item()),
        "grad_diff": max((full[n] - dense_params[n].grad).abs().max().item() for n in full),
        "embed": type(model.model.embed_tokens.weight).__name__,
        "embed_rows": model.model.embed_tokens.weight.to_local().shape[0],
        "q_rows": model.model.layers[0].self_attn.q_proj.weight.to_local().shape[0],
    }


@needs_transformers
def test_stock_llama_split_by_its_own_plan_equals_the_dense_model(dist_pool: DistributedPool) -> None:
    for result in dist_pool.run(rank_llama_tp):
        assert result["logits_diff"] < 1e-5 and result["loss_diff"] < 1e-5 and result["grad_diff"] < 1e-5
        assert result["embed"] == "DTensor" and result["embed_rows"] == 16 and result["q_rows"] == 8

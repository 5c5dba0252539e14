"""``MegatronLMPlugin`` + model config + optimizer -> megatron-core's settings, as plain dicts.

Each function returns the keyword arguments of one megatron-core object (``parallel_state.
initialize_model_parallel``, ``TransformerConfig``, ``OptimizerConfig``, ``DistributedDataParallelConfig``,
``OptimizerParamScheduler``), so the translation is tested without megatron-core or CUDA; the
strategy builds the objects. ``other_megatron_args`` keys go to the object that has that field; a key
none has is refused by name (`route_other_args()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ModelFacts",
    "ddp_config_kwargs",
    "model_facts",
    "optimizer_config_kwargs",
    "parallel_state_kwargs",
    "route_other_args",
    "scheduler_kwargs",
    "transformer_config_kwargs",
]

#: ``other_megatron_args`` keys read by accel itself (model construction, not a megatron-core config).
MODEL_KEYS = frozenset(
    {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_hidden_size",
        "vocab_size",
        "max_position_embeddings",
        "position_embedding_type",
        "use_rotary_position_embeddings",
        "attention_head_type",
        "vocab_file",
        "merge_file",
        "eod_mask_loss",
        "no_load_optim",
        "no_save_optim",
        "use_custom_fsdp",
        "overlap_cpu_optimizer_d2h_h2d",
        "attention_backend",
        "seed",
    }
)

#: Model families megatron-core has, by Hugging Face ``model_type``.
_FAMILIES = {"bert": "bert", "t5": "t5", "mt5": "t5"}


@dataclass(frozen=True)
class ModelFacts:
    """Sizes of the model to build, read from a Hugging Face config (or ``other_megatron_args``)."""

    family: str  # "gpt", "bert" or "t5"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    num_query_groups: int | None = None


def _first(config: Any, names: Iterable[str]) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def model_facts(hf_config: Any, other: Mapping[str, Any] | None = None) -> ModelFacts:
    """The sizes of the model, from a transformers config; ``other_megatron_args`` win.

    Raises:
        ValueError: a size is found in neither, naming it.
    """
    other = dict(other or {})
    model_type = str(getattr(hf_config, "model_type", "") or "")
    family = _FAMILIES.get(model_type, "gpt")
    found = {
        "num_layers": _first(hf_config, ("num_hidden_layers", "n_layer", "num_layers")),
        "hidden_size": _first(hf_config, ("hidden_size", "n_embd", "d_model")),
        "num_attention_heads": _first(hf_config, ("num_attention_heads", "n_head", "num_heads")),
        "ffn_hidden_size": _first(hf_config, ("intermediate_size", "n_inner", "d_ff")),
        "vocab_size": _first(hf_config, ("vocab_size",)),
        "max_position_embeddings": _first(hf_config, ("max_position_embeddings", "n_positions", "n_ctx")),
    }
    for key in found:
        if key in other:
            found[key] = other[key]
    if found["ffn_hidden_size"] is None and found["hidden_size"] is not None:
        found["ffn_hidden_size"] = 4 * int(found["hidden_size"])
    if found["max_position_embeddings"] is None and family == "t5":
        found["max_position_embeddings"] = 512
    missing = [key for key, value in found.items() if value is None]
    if missing:
        raise ValueError(
            f"cannot read {missing} from the model's config ({type(hf_config).__name__}); give them in "
            "MegatronLMPlugin(other_megatron_args={...})"
        )
    groups = _first(hf_config, ("num_key_value_heads",))
    return ModelFacts(family=family, num_query_groups=groups, **{k: int(v) for k, v in found.items()})


def _virtual_stages(plugin: Any, num_layers: int | None) -> int | None:
    per_stage = plugin.num_layers_per_virtual_pipeline_stage
    if per_stage is None:
        return None
    pp = plugin.pp_degree or 1
    if num_layers is None or num_layers % (pp * per_stage):
        raise ValueError(
            f"num_layers_per_virtual_pipeline_stage={per_stage} must divide the layers per pipeline stage "
            f"({num_layers} layers / pp_degree {pp})"
        )
    return num_layers // (pp * per_stage)


def parallel_state_kwargs(plugin: Any, num_layers: int | None = None) -> dict[str, Any]:
    """Arguments of ``megatron.core.parallel_state.initialize_model_parallel``."""
    other = plugin.other_megatron_args or {}
    kwargs: dict[str, Any] = {
        "tensor_model_parallel_size": plugin.tp_degree or 1,
        "pipeline_model_parallel_size": plugin.pp_degree or 1,
        "virtual_pipeline_model_parallel_size": _virtual_stages(plugin, num_layers),
        "context_parallel_size": other.get("context_parallel_size", 1),
        "expert_model_parallel_size": other.get("expert_model_parallel_size", 1),
    }
    if other.get("expert_tensor_parallel_size") is not None:
        kwargs["expert_tensor_parallel_size"] = other["expert_tensor_parallel_size"]
    return kwargs


def _dtypes(mixed_precision: str) -> dict[str, Any]:
    import torch

    if mixed_precision == "bf16":
        return {"bf16": True, "params_dtype": torch.bfloat16}
    if mixed_precision == "fp16":
        return {"fp16": True, "params_dtype": torch.float16}
    return {"params_dtype": torch.float32}


def transformer_config_kwargs(plugin: Any, facts: ModelFacts, mixed_precision: str = "no") -> dict[str, Any]:
    """Arguments of ``megatron.core.transformer.TransformerConfig`` (sizes, parallelism, recompute, dtypes)."""
    kwargs: dict[str, Any] = {
        "num_layers": facts.num_layers,
        "hidden_size": facts.hidden_size,
        "num_attention_heads": facts.num_attention_heads,
        "ffn_hidden_size": facts.ffn_hidden_size,
        "tensor_model_parallel_size": plugin.tp_degree or 1,
        "pipeline_model_parallel_size": plugin.pp_degree or 1,
        "virtual_pipeline_model_parallel_size": _virtual_stages(plugin, facts.num_layers),
        "sequence_parallel": bool(plugin.sequence_parallelism) and (plugin.tp_degree or 1) > 1,
        **_dtypes(mixed_precision),
    }
    kwargs["pipeline_dtype"] = kwargs["params_dtype"]
    if facts.num_query_groups is not None and facts.num_query_groups != facts.num_attention_heads:
        kwargs["num_query_groups"] = facts.num_query_groups
    if plugin.recompute_activations:
        kwargs["recompute_granularity"] = "selective"
    return kwargs


def optimizer_config_kwargs(plugin: Any, optimizer: Any, mixed_precision: str = "no") -> dict[str, Any]:
    """Arguments of ``megatron.core.optimizer.OptimizerConfig`` from the user's torch optimizer.

    Raises:
        ValueError: the optimizer is neither Adam/AdamW nor SGD (megatron-core builds only those).
    """
    name = type(optimizer).__name__.lower()
    defaults = dict(getattr(optimizer, "defaults", {}))
    if name.startswith("adam"):
        kind = "adam"
    elif name == "sgd":
        kind = "sgd"
    else:
        raise ValueError(
            f"Megatron-LM builds its own Adam or SGD optimizer; got {type(optimizer).__name__}. "
            "Pass torch.optim.AdamW / Adam / SGD (their lr, betas, eps, weight_decay, momentum are used)"
        )
    kwargs: dict[str, Any] = {
        "optimizer": kind,
        "lr": float(defaults.get("lr", 1e-3)),
        "min_lr": float(plugin.min_lr),
        "weight_decay": float(defaults.get("weight_decay", 0.0)),
        "clip_grad": float(plugin.gradient_clipping or 0.0),
        "use_distributed_optimizer": bool(plugin.use_distributed_optimizer),
        **{k: v for k, v in _dtypes(mixed_precision).items() if k != "params_dtype"},
    }
    if kind == "adam":
        betas = defaults.get("betas", (0.9, 0.999))
        kwargs.update(adam_beta1=float(betas[0]), adam_beta2=float(betas[1]), adam_eps=float(defaults.get("eps", 1e-8)))
    else:
        kwargs["sgd_momentum"] = float(defaults.get("momentum", 0.0))
    return kwargs


def ddp_config_kwargs(plugin: Any) -> dict[str, Any]:
    """Arguments of ``megatron.core.distributed.DistributedDataParallelConfig``."""
    return {"use_distributed_optimizer": bool(plugin.use_distributed_optimizer), "grad_reduce_in_fp32": True}


def scheduler_kwargs(plugin: Any, dummy: Any, lr: float, weight_decay: float) -> dict[str, Any]:
    """Arguments of ``megatron.core.optimizer_param_scheduler.OptimizerParamScheduler`` (steps, not samples).

    ``dummy`` is the `MegatronLMDummyScheduler` the script prepared: its ``total_num_steps``
    and ``warmup_num_steps`` apply where the plugin gives no ``lr_decay_iters`` / ``lr_warmup_iters``.

    Raises:
        ValueError: no length of training is known (neither the plugin nor the dummy scheduler gives one).
    """
    total = plugin.lr_decay_iters or plugin.train_iters or getattr(dummy, "total_num_steps", None)
    if not total:
        raise ValueError(
            "the learning-rate schedule needs a length: give MegatronLMDummyScheduler(total_num_steps=...) or "
            "MegatronLMPlugin(train_iters=...)"
        )
    warmup = plugin.lr_warmup_iters
    if warmup is None and plugin.lr_warmup_fraction is not None:
        warmup = int(plugin.lr_warmup_fraction * total)
    if warmup is None:
        warmup = getattr(dummy, "warmup_num_steps", 0) or 0
    start_wd = plugin.start_weight_decay if plugin.start_weight_decay is not None else weight_decay
    end_wd = plugin.end_weight_decay if plugin.end_weight_decay is not None else weight_decay
    return {
        "init_lr": 0.0 if warmup else lr,
        "max_lr": lr,
        "min_lr": float(plugin.min_lr),
        "lr_warmup_steps": int(warmup),
        "lr_decay_steps": int(total),
        "lr_decay_style": plugin.lr_decay_style,
        "start_wd": float(start_wd),
        "end_wd": float(end_wd),
        "wd_incr_steps": int(plugin.train_iters or total),
        "wd_incr_style": plugin.weight_decay_incr_style,
    }


def route_other_args(other: Mapping[str, Any], fields: Mapping[str, Iterable[str]]) -> dict[str, dict[str, Any]]:
    """Send each ``other_megatron_args`` key to the config that has a field of that name.

    Args:
        other: the plugin's ``other_megatron_args``.
        fields: ``{config name: its field names}`` (e.g. from ``dataclasses.fields`` of megatron-core's
            configs); keys read by accel itself (`MODEL_KEYS`) go nowhere.

    Returns:
        ``{config name: {key: value}}``.

    Raises:
        ValueError: a key no config has, naming it and where keys can go.
    """
    routed: dict[str, dict[str, Any]] = {name: {} for name in fields}
    unknown = []
    for key, value in other.items():
        if key in MODEL_KEYS:
            continue
        targets = [name for name, names in fields.items() if key in set(names)]
        if not targets:
            unknown.append(key)
        for name in targets:
            routed[name][key] = value
    if unknown:
        raise ValueError(
            f"other_megatron_args has {sorted(unknown)}, which no megatron-core config has; keys go to "
            f"{sorted(fields)} fields, or are one of {sorted(MODEL_KEYS)}"
        )
    return routed

"""``MegatronLMPlugin``: the settings of Megatron-LM, from code or the launcher (``MEGATRON_LM_*``).

The documented fields are the settings of the documented system. The launcher's newer
``--megatron_lm_*`` flags (recompute granularity, dropouts, expert sizes, ...) arrive as
``MEGATRON_LM_*`` variables and are folded into :attr:`other_megatron_args` under megatron-core's
names, unless the script already set them there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_train.plugin_env import env_value, fill_from_env

__all__ = ["EXTENDED_SETTINGS", "MegatronLMPlugin"]

#: Launcher-only settings: ``MEGATRON_LM_<NAME>`` -> the key in ``other_megatron_args``.
EXTENDED_SETTINGS: dict[str, str] = {
    "use_custom_fsdp": "use_custom_fsdp",
    "no_load_optim": "no_load_optim",
    "eod_mask_loss": "eod_mask_loss",
    "no_save_optim": "no_save_optim",
    "optimizer_cpu_offload": "optimizer_cpu_offload",
    "use_precision_aware_optimizer": "use_precision_aware_optimizer",
    "overlap_cpu_optimizer_d2h_h2d": "overlap_cpu_optimizer_d2h_h2d",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "recompute_granularity": "recompute_granularity",
    "recompute_method": "recompute_method",
    "recompute_num_layers": "recompute_num_layers",
    "attention_backend": "attention_backend",
    "expert_model_parallel_size": "expert_model_parallel_size",
    "context_parallel_size": "context_parallel_size",
    "attention_dropout": "attention_dropout",
    "hidden_dropout": "hidden_dropout",
    "attention_softmax_in_fp32": "attention_softmax_in_fp32",
    "expert_tensor_parallel_size": "expert_tensor_parallel_size",
    "calculate_per_token_loss": "calculate_per_token_loss",
    "use_rotary_position_embeddings": "use_rotary_position_embeddings",
}


def _check(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{owner}.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class MegatronLMPlugin:
    """Settings of Megatron-LM (tensor/pipeline degrees, micro-batches, recomputation, ...).

    Args:
        tp_degree: tensor-parallel degree.
        pp_degree: pipeline-parallel degree.
        num_micro_batches: micro-batches per step (pipeline).
        gradient_clipping: clip the global L2 norm of gradients at this value (0 disables).
        sequence_parallelism: sequence parallelism inside tensor-parallel groups.
        recompute_activations: selective activation recomputation.
        use_distributed_optimizer: shard optimizer state and gradients over data-parallel ranks.
        pipeline_model_parallel_split_rank: rank where the decoder starts (encoder-decoder models).
        num_layers_per_virtual_pipeline_stage: layers per virtual stage (interleaved 1F1B).
        is_train_batch_min: the data loaders' smallest batch size is the micro-batch size (else the largest).
        train_iters, train_samples: length of training, in steps or samples.
        weight_decay_incr_style, start_weight_decay, end_weight_decay: weight-decay schedule.
        lr_decay_style, lr_decay_iters, lr_decay_samples, lr_warmup_iters, lr_warmup_samples,
            lr_warmup_fraction, min_lr: learning-rate schedule.
        consumed_samples: samples consumed by each of the train / valid / test loaders (resuming).
        no_wd_decay_cond, scale_lr_cond, lr_mult: which parameters get no weight decay / a scaled LR.
        megatron_dataset_flag: the data loaders are Megatron-LM indexed datasets.
        seq_length, encoder_seq_length, decoder_seq_length: sequence lengths.
        tensorboard_dir, set_all_logging_options: logging.
        eval_iters, eval_interval: evaluation length and period.
        return_logits: the model's output carries the logits (on the last pipeline stage).
        custom_train_step_class, custom_train_step_kwargs: a train step replacing the model's default.
        custom_model_provider_function: ``provider(pre_process, post_process) -> megatron-core model``.
        custom_prepare_model_function: ``fn(model_provider) -> model`` replacing the default wrapping.
        custom_megatron_datasets_provider_function, custom_get_batch_function, custom_loss_function:
            replacements for the dataset provider, batch function and loss function.
        other_megatron_args: further settings under megatron-core's names (``TransformerConfig``,
            ``OptimizerConfig`` and ``DistributedDataParallelConfig`` fields, model sizes).
    """

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Any = None
    scale_lr_cond: Any = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Any = None
    custom_prepare_model_function: Any = None
    custom_megatron_datasets_provider_function: Any = None
    custom_get_batch_function: Any = None
    custom_loss_function: Any = None
    other_megatron_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        name = "MegatronLMPlugin"
        fill_from_env(
            self,
            {
                "tp_degree": ("MEGATRON_LM_TP_DEGREE", 1),
                "pp_degree": ("MEGATRON_LM_PP_DEGREE", 1),
                "num_micro_batches": ("MEGATRON_LM_NUM_MICRO_BATCHES", 1),
                "gradient_clipping": ("MEGATRON_LM_GRADIENT_CLIPPING", 1.0),
                "sequence_parallelism": ("MEGATRON_LM_SEQUENCE_PARALLELISM", False),
                "recompute_activations": ("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", False),
                "use_distributed_optimizer": ("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", False),
            },
        )
        for key in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}.{key} must be an int >= 1, got {value!r}")
        _check(name, "weight_decay_incr_style", self.weight_decay_incr_style, ("constant", "linear", "cosine"))
        _check(name, "lr_decay_style", self.lr_decay_style, ("constant", "linear", "cosine", "inverse-square-root"))
        if self.other_megatron_args is not None and not isinstance(self.other_megatron_args, dict):
            raise TypeError(f"{name}.other_megatron_args must be a dict, got {type(self.other_megatron_args).__name__}")
        other = dict(self.other_megatron_args or {})
        for setting, key in EXTENDED_SETTINGS.items():
            value = env_value(f"MEGATRON_LM_{setting.upper()}", None)
            if value is not None:
                other.setdefault(key, value)
        self.other_megatron_args = other
        #: Set by ``prepare`` from the data loaders: samples per micro-batch and per optimizer step.
        self.micro_batch_size: int | None = None
        self.global_batch_size: int | None = None

    def set_batch_sizes(self, micro_batch_size: int, data_parallel_size: int) -> None:
        """Record the micro-batch size and the global batch size it gives (``micro x dp x micro-batches``)."""
        if micro_batch_size < 1:
            raise ValueError(f"the micro-batch size must be >= 1, got {micro_batch_size}")
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = micro_batch_size * data_parallel_size * (self.num_micro_batches or 1)

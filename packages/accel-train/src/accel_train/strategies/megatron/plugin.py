"""``MegatronLMPlugin``: the settings of Megatron-LM, from code or the launcher (``MEGATRON_LM_*``).

The documented fields are the settings of the documented system. The launcher's newer
``--megatron_lm_*`` flags (recompute granularity, dropouts, expert sizes, ...) arrive as
``MEGATRON_LM_*`` variables and are folded into `other_megatron_args` under megatron-core's
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
        tp_degree: Tensor-parallel degree. Defaults to `None` (launcher value, else `1`).
        pp_degree: Pipeline-parallel degree. Defaults to `None` (launcher value, else `1`).
        num_micro_batches: Micro-batches per step (pipeline). Defaults to `None` (launcher value, else `1`).
        gradient_clipping: Clip the global L2 norm of gradients at this value (`0` disables).
            Defaults to `None` (launcher value, else `1.0`).
        sequence_parallelism: Sequence parallelism inside tensor-parallel groups. Defaults to `None`
            (launcher value, else `False`).
        recompute_activations: Selective activation recomputation. Defaults to `None` (launcher value, else `False`).
        use_distributed_optimizer: Shard optimizer state and gradients over data-parallel ranks.
            Defaults to `None` (launcher value, else `False`).
        pipeline_model_parallel_split_rank: Rank where the decoder starts (encoder-decoder models).
            Defaults to `None`.
        num_layers_per_virtual_pipeline_stage: Layers per virtual stage (interleaved 1F1B). Defaults to `None`.
        is_train_batch_min: The data loaders' smallest batch size is the micro-batch size (else the largest).
            Defaults to `True`.
        train_iters: Total number of training steps; give this or ``train_samples``. Defaults to `None`.
        train_samples: Total number of training samples; give this or ``train_iters``. Defaults to `None`.
        weight_decay_incr_style: How weight decay moves from ``start_weight_decay`` to ``end_weight_decay``:
            `constant`, `linear` or `cosine`. Defaults to `"constant"`.
        start_weight_decay: Weight decay at the start of training. Defaults to `None`.
        end_weight_decay: Weight decay at the end of training. Defaults to `None`.
        lr_decay_style: Learning-rate decay: `constant`, `linear`, `cosine` or `inverse-square-root`.
            Defaults to `"linear"`.
        lr_decay_iters: Steps over which the learning rate decays (`None`: ``train_iters``). Defaults to `None`.
        lr_decay_samples: Samples over which the learning rate decays (`None`: ``train_samples``).
            Defaults to `None`.
        lr_warmup_iters: Steps of linear learning-rate warm-up. Defaults to `None`.
        lr_warmup_samples: Samples of linear learning-rate warm-up. Defaults to `None`.
        lr_warmup_fraction: Fraction of the decay steps spent warming up. Defaults to `None`.
        min_lr: Lowest learning rate the schedule decays to. Defaults to `0`.
        consumed_samples: Samples consumed by each of the train / valid / test loaders (resuming).
            Defaults to `None`.
        no_wd_decay_cond: Callable ``(name, param) -> bool`` choosing the parameters without weight decay.
            Defaults to `None`.
        scale_lr_cond: Callable ``(name, param) -> bool`` choosing the parameters whose learning rate is scaled
            by ``lr_mult``. Defaults to `None`.
        lr_mult: Learning-rate multiplier of the parameters chosen by ``scale_lr_cond``. Defaults to `1.0`.
        megatron_dataset_flag: The data loaders are Megatron-LM indexed datasets. Defaults to `False`.
        seq_length: Maximum sequence length of decoder-only or encoder-only models. Defaults to `None`.
        encoder_seq_length: Maximum sequence length of the encoder. Defaults to `None`.
        decoder_seq_length: Maximum sequence length of the decoder. Defaults to `None`.
        tensorboard_dir: Folder Megatron-LM writes TensorBoard logs to. Defaults to `None`.
        set_all_logging_options: Whether every Megatron-LM logging option is switched on. Defaults to `False`.
        eval_iters: Number of steps of each evaluation. Defaults to `100`.
        eval_interval: Training steps between two evaluations. Defaults to `1000`.
        return_logits: The model's output carries the logits (on the last pipeline stage). Defaults to `False`.
        custom_train_step_class: A train-step class replacing the model's default one. Defaults to `None`.
        custom_train_step_kwargs: Keyword arguments of ``custom_train_step_class``. Defaults to `None`.
        custom_model_provider_function: ``provider(pre_process, post_process) -> megatron-core model``.
            Defaults to `None`.
        custom_prepare_model_function: ``fn(model_provider) -> model`` replacing the default wrapping.
            Defaults to `None`.
        custom_megatron_datasets_provider_function: Replacement of the Megatron-LM datasets provider.
            Defaults to `None`.
        custom_get_batch_function: Replacement of the function that takes a batch from the data iterator.
            Defaults to `None`.
        custom_loss_function: Replacement of the loss function. Defaults to `None`.
        other_megatron_args: Further settings under megatron-core's names (``TransformerConfig``,
            ``OptimizerConfig`` and ``DistributedDataParallelConfig`` fields, model sizes). Defaults to `None`.
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
        """Record the micro-batch size and the global batch size it gives (``micro x dp x micro-batches``).

        Args:
            micro_batch_size: Batch size of one process per micro-batch; at least 1.
            data_parallel_size: Number of data-parallel ranks.
        """
        if micro_batch_size < 1:
            raise ValueError(f"the micro-batch size must be >= 1, got {micro_batch_size}")
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = micro_batch_size * data_parallel_size * (self.num_micro_batches or 1)

"""``MegatronLMPlugin``: the settings of Megatron-LM, from code or the launcher (``MEGATRON_LM_*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_train.plugin_env import fill_from_env

__all__ = ["MegatronLMPlugin"]


def _check(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{owner}.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class MegatronLMPlugin:
    """Settings of Megatron-LM (tensor/pipeline degrees, micro-batches, recomputation, ...)."""

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

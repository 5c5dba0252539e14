"""FSDP, DeepSpeed, Megatron-LM and tensor/context-parallel configurations.

They are accepted and validated now, so that configs and scripts written for them are checked early;
preparing a model with one of them raises :class:`BackendNotAvailableError` until the backend lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "BackendNotAvailableError",
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "MegatronLMPlugin",
    "ParallelismConfig",
    "TorchTensorParallelPlugin",
    "not_available",
]


class BackendNotAvailableError(NotImplementedError):
    """A documented backend whose implementation comes in a later release of accel."""


def not_available(backend: str) -> BackendNotAvailableError:
    return BackendNotAvailableError(
        f"{backend} is not available yet in accel; coming in a later release. Its plugin was accepted and "
        "validated, but preparing objects with it is not supported. Run without it (single process or DDP)."
    )


def _check(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{owner}.{name}={value!r} is not valid; choose one of {[c for c in choices]}")


_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", 1, 2, 3, 4, 5)
_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
_STATE_DICT = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_WRAP = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


@dataclass
class FullyShardedDataParallelPlugin:
    """Settings of Fully Sharded Data Parallel (FSDP 1 or 2)."""

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Any = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        name = "FullyShardedDataParallelPlugin"
        if self.fsdp_version is None:
            self.fsdp_version = 1
        _check(name, "fsdp_version", self.fsdp_version, (1, 2))
        self.sharding_strategy = _upper(self.sharding_strategy)
        if isinstance(self.sharding_strategy, (str, int)):
            _check(name, "sharding_strategy", self.sharding_strategy, _SHARDING)
        if self.fsdp_version == 2 and self.sharding_strategy is not None:
            raise ValueError(f"{name}: sharding_strategy is FSDP1 only; with fsdp_version=2 use reshard_after_forward")
        self.backward_prefetch = _upper(self.backward_prefetch)
        if isinstance(self.backward_prefetch, str):
            _check(name, "backward_prefetch", self.backward_prefetch, _PREFETCH)
        self.state_dict_type = _upper(self.state_dict_type)
        if isinstance(self.state_dict_type, str):
            _check(name, "state_dict_type", self.state_dict_type, _STATE_DICT)
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = self.auto_wrap_policy.upper()
            _check(name, "auto_wrap_policy", self.auto_wrap_policy, _WRAP)
        if self.min_num_params is not None and self.min_num_params < 0:
            raise ValueError(f"{name}.min_num_params must be >= 0, got {self.min_num_params}")
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [n.strip() for n in self.transformer_cls_names_to_wrap.split(",")]


_OFFLOAD = ("none", "cpu", "nvme")


@dataclass
class DeepSpeedPlugin:
    """Settings of DeepSpeed (ZeRO stage, offload, config file or dict)."""

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        name = "DeepSpeedPlugin"
        _check(name, "zero_stage", self.zero_stage, (0, 1, 2, 3))
        _check(name, "offload_optimizer_device", self.offload_optimizer_device, _OFFLOAD)
        _check(name, "offload_param_device", self.offload_param_device, _OFFLOAD)
        _check(name, "msamp_opt_level", self.msamp_opt_level, ("O1", "O2"))
        if self.zero3_init_flag and self.zero_stage not in (None, 3):
            raise ValueError(f"{name}.zero3_init_flag needs zero_stage=3, got zero_stage={self.zero_stage}")
        if (
            self.hf_ds_config is not None
            and not isinstance(self.hf_ds_config, (str, dict))
            and not hasattr(self.hf_ds_config, "config")
        ):
            raise TypeError(
                f"{name}.hf_ds_config must be a path to a JSON file or a dict, got {type(self.hf_ds_config)}"
            )
        self.selected = False

    def select(self, _from_accelerator_state: bool = False) -> None:
        self.selected = True

    def _unselect(self) -> None:
        self.selected = False


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
        for key in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}.{key} must be an int >= 1, got {value!r}")
        _check(name, "weight_decay_incr_style", self.weight_decay_incr_style, ("constant", "linear", "cosine"))
        _check(name, "lr_decay_style", self.lr_decay_style, ("constant", "linear", "cosine", "inverse-square-root"))


@dataclass
class TorchTensorParallelPlugin:
    """Deprecated: tensor parallelism through ``ParallelismConfig(tp_size=...)``."""

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"TorchTensorParallelPlugin.tp_size must be an int >= 1, got {self.tp_size!r}")


@dataclass
class ParallelismConfig:
    """Sizes of the data-replicate, data-shard, tensor and context parallel dimensions."""

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None
    _extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name.endswith("_size"):
                value = getattr(self, f.name)
                if value is None:
                    setattr(self, f.name, 1)
                elif not isinstance(value, int) or value < 1:
                    raise ValueError(f"ParallelismConfig.{f.name} must be an int >= 1, got {value!r}")
        _check("ParallelismConfig", "cp_backend", self.cp_backend, ("torch", "deepspeed"))

    @property
    def total_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def is_trivial(self) -> bool:
        """True when every dimension has size 1 (or only plain data parallelism)."""
        return self.dp_shard_size == 1 and self.tp_size == 1 and self.cp_size == 1 and self.sp_size == 1

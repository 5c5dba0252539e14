"""The environment-variable protocol between ``accel launch`` and the processes it starts.

Every ``ACCELERATE_*`` / ``FSDP_*`` / ``ACCELERATE_DEEPSPEED_*`` / ``MEGATRON_LM_*`` /
``PARALLELISM_CONFIG_*`` variable that a launcher sets or a state reads is declared here once,
with its type and default. The launcher writes them with `encode()`; the processes read them
with `read()`. Documented names are kept so that launchers and scripts written for the
documented system work unchanged. This module imports nothing heavy (no torch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel_state.environment import str_to_bool

_TYPES = ("bool", "int", "float", "str", "list")


@dataclass(frozen=True)
class EnvVar:
    """One variable of the protocol: its name, value type, default and meaning."""

    name: str
    type: str
    default: Any
    help: str

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise ValueError(f"EnvVar {self.name}: type {self.type!r} is not one of {_TYPES}")

    def parse(self, raw: str) -> Any:
        """Turn the raw string from the environment into a value of this variable's type."""
        if self.type == "bool":
            return bool(str_to_bool(raw))
        if self.type == "int":
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {self.name}={raw!r} must be an integer") from None
        if self.type == "float":
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"environment variable {self.name}={raw!r} must be a number") from None
        if self.type == "list":
            return [item.strip() for item in raw.split(",") if item.strip()]
        return raw

    def encode(self, value: Any) -> str:
        """Turn a value into the string a launcher puts in the environment."""
        if self.type == "bool":
            return "true" if value else "false"
        if self.type == "list" and not isinstance(value, str):
            return ",".join(str(item) for item in value)
        return str(value)


def _v(name: str, type_: str, default: Any, help_: str) -> EnvVar:
    return EnvVar(name, type_, default, help_)


_ALL: tuple[EnvVar, ...] = (
    # general
    _v("ACCELERATE_MIXED_PRECISION", "str", "no", "mixed precision mode: no, fp16, bf16 or fp8"),
    _v("ACCELERATE_USE_CPU", "bool", False, "force execution on CPU even when an accelerator is present"),
    _v("ACCELERATE_DEBUG_MODE", "bool", False, "check shapes across ranks before each collective"),
    _v("ACCELERATE_LOG_LEVEL", "str", None, "log level of accel loggers (INFO, DEBUG, ...)"),
    _v(
        "ACCELERATE_TORCH_DEVICE",
        "str",
        None,
        "torch device to run on: a type (hpu, xpu) or a type and index (cuda:1) that pins the device",
    ),
    _v("ACCELERATE_CPU_AFFINITY", "bool", False, "pin each process to the CPU cores near its GPU"),
    _v("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "int", 1, "number of gradient accumulation steps"),
    _v("ACCELERATE_GRADIENT_CLIPPING", "float", None, "gradient clipping value (DeepSpeed)"),
    _v("ACCELERATE_DOWNCAST_BF16", "bool", False, "downcast fp32 to bf16 on XLA"),
    _v("ACCELERATE_USE_SAGEMAKER", "bool", False, "running under Amazon SageMaker"),
    _v("ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE", "str", "NO", "SageMaker distribution mode"),
    _v("ACCELERATE_USE_XPU", "bool", False, "use Intel XPU devices"),
    _v("ACCELERATE_USE_IPEX", "bool", False, "use Intel Extension for PyTorch"),
    _v("ACCELERATE_DISABLE_RICH", "bool", False, "disable rich tracebacks"),
    _v("ACCELERATE_CONFIG_FILE", "str", None, "path of the config file used by the launcher"),
    _v("ACCELERATE_BYPASS_DEVICE_MAP", "bool", False, "ignore device maps when preparing models"),
    _v("ACCELERATE_INIT_INCLUDE_BUFFERS", "bool", False, "init_empty_weights also puts buffers on meta"),
    _v("ACCELERATE_DYNAMO_BACKEND", "str", "NO", "torch.compile backend"),
    _v("ACCELERATE_DYNAMO_MODE", "str", "default", "torch.compile mode"),
    _v("ACCELERATE_DYNAMO_USE_FULLGRAPH", "bool", False, "torch.compile fullgraph"),
    _v("ACCELERATE_DYNAMO_USE_DYNAMIC", "bool", False, "torch.compile dynamic shapes"),
    _v("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "bool", False, "compile repeated blocks once"),
    # DeepSpeed
    _v("ACCELERATE_USE_DEEPSPEED", "bool", False, "use DeepSpeed"),
    _v("ACCELERATE_DEEPSPEED_CONFIG_FILE", "str", None, "DeepSpeed JSON config file"),
    _v("ACCELERATE_DEEPSPEED_ZERO_STAGE", "int", 2, "ZeRO stage"),
    _v("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "str", "none", "optimizer offload device"),
    _v("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "str", "none", "parameter offload device"),
    _v("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "str", "none", "NVMe path for optimizer offload"),
    _v("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "str", "none", "NVMe path for parameter offload"),
    _v("ACCELERATE_DEEPSPEED_ZERO3_INIT", "bool", False, "build models directly sharded under ZeRO-3"),
    _v("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "bool", False, "gather 16-bit weights when saving"),
    _v("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "list", None, "MoE layer class names for ZeRO-3"),
    _v("ACCELERATE_CONFIG_DS_FIELDS", "list", None, "config keys that the DeepSpeed config file also sets"),
    # FSDP
    _v("ACCELERATE_USE_FSDP", "bool", False, "use Fully Sharded Data Parallel"),
    _v("FSDP_VERSION", "int", 1, "FSDP API version (1 or 2)"),
    _v("FSDP_SHARDING_STRATEGY", "str", "FULL_SHARD", "FSDP1 sharding strategy"),
    _v("FSDP_RESHARD_AFTER_FORWARD", "str", "true", "FSDP2 reshard after forward (or FSDP1 strategy)"),
    _v("FSDP_OFFLOAD_PARAMS", "bool", False, "offload parameters to CPU"),
    _v("FSDP_MIN_NUM_PARAMS", "int", 0, "size-based auto wrap threshold"),
    _v("FSDP_AUTO_WRAP_POLICY", "str", None, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP"),
    _v("FSDP_TRANSFORMER_CLS_TO_WRAP", "list", None, "layer class names to wrap"),
    _v("FSDP_BACKWARD_PREFETCH", "str", None, "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH"),
    _v("FSDP_FORWARD_PREFETCH", "bool", False, "prefetch the next all-gather in forward"),
    _v("FSDP_STATE_DICT_TYPE", "str", None, "FULL_STATE_DICT, LOCAL_STATE_DICT or SHARDED_STATE_DICT"),
    _v("FSDP_USE_ORIG_PARAMS", "bool", True, "use original parameters (needed for torch.compile)"),
    _v("FSDP_CPU_RAM_EFFICIENT_LOADING", "bool", True, "load weights on rank 0 only"),
    _v("FSDP_SYNC_MODULE_STATES", "bool", True, "broadcast module states from rank 0"),
    _v("FSDP_ACTIVATION_CHECKPOINTING", "bool", False, "checkpoint activations of wrapped layers"),
    _v("FSDP_CPU_OFFLOAD", "bool", False, "alias of FSDP_OFFLOAD_PARAMS kept for old launchers"),
    _v("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "bool", False, "offload checkpointed activations to the CPU"),
    _v("FSDP_IGNORED_MODULES", "str", None, "regular expression of module names FSDP leaves unsharded"),
    # Megatron-LM
    _v("ACCELERATE_USE_MEGATRON_LM", "bool", False, "use Megatron-LM"),
    _v("MEGATRON_LM_TP_DEGREE", "int", 1, "tensor parallel degree"),
    _v("MEGATRON_LM_PP_DEGREE", "int", 1, "pipeline parallel degree"),
    _v("MEGATRON_LM_NUM_MICRO_BATCHES", "int", 1, "number of micro-batches"),
    _v("MEGATRON_LM_SEQUENCE_PARALLELISM", "bool", False, "sequence parallelism"),
    _v("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "bool", False, "selective activation recomputation"),
    _v("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", "bool", False, "shard optimizer state"),
    _v("MEGATRON_LM_GRADIENT_CLIPPING", "float", 1.0, "gradient clipping"),
    _v("MEGATRON_LM_USE_CUSTOM_FSDP", "bool", None, "megatron's own fsdp implementation"),
    _v("MEGATRON_LM_NO_LOAD_OPTIM", "bool", None, "do not load the optimizer state when resuming"),
    _v("MEGATRON_LM_EOD_MASK_LOSS", "bool", None, "mask the loss at end-of-document tokens"),
    _v("MEGATRON_LM_NO_SAVE_OPTIM", "bool", None, "do not save the optimizer state"),
    _v("MEGATRON_LM_OPTIMIZER_CPU_OFFLOAD", "bool", None, "keep the optimizer state on cpu"),
    _v("MEGATRON_LM_USE_PRECISION_AWARE_OPTIMIZER", "bool", None, "precision-aware optimizer"),
    _v(
        "MEGATRON_LM_OVERLAP_CPU_OPTIMIZER_D2H_H2D",
        "bool",
        None,
        "overlap device/host copies of a cpu-offloaded optimizer",
    ),
    _v("MEGATRON_LM_DECODER_LAST_PIPELINE_NUM_LAYERS", "int", None, "decoder layers on the last pipeline stage"),
    _v("MEGATRON_LM_RECOMPUTE_GRANULARITY", "str", None, "activation recomputation granularity"),
    _v("MEGATRON_LM_RECOMPUTE_METHOD", "str", None, "activation recomputation method"),
    _v("MEGATRON_LM_RECOMPUTE_NUM_LAYERS", "int", None, "layers recomputed per stage or chunk"),
    _v("MEGATRON_LM_ATTENTION_BACKEND", "str", None, "attention implementation megatron-lm uses"),
    _v("MEGATRON_LM_EXPERT_MODEL_PARALLEL_SIZE", "int", None, "expert"),
    _v("MEGATRON_LM_CONTEXT_PARALLEL_SIZE", "int", None, "context parallel size inside megatron-lm"),
    _v("MEGATRON_LM_ATTENTION_DROPOUT", "float", None, "dropout probability of attention"),
    _v("MEGATRON_LM_HIDDEN_DROPOUT", "float", None, "dropout probability of hidden states"),
    _v("MEGATRON_LM_ATTENTION_SOFTMAX_IN_FP32", "bool", None, "compute the attention softmax in fp32"),
    _v("MEGATRON_LM_EXPERT_TENSOR_PARALLEL_SIZE", "int", None, "tensor parallel size of the experts"),
    _v("MEGATRON_LM_CALCULATE_PER_TOKEN_LOSS", "bool", None, "average the loss over tokens rather than micro-batches"),
    _v("MEGATRON_LM_USE_ROTARY_POSITION_EMBEDDINGS", "bool", None, "rotary position embeddings"),
    # FP8
    _v("ACCELERATE_FP8_BACKEND", "str", None, "FP8 backend: te, msamp or ao"),
    _v("ACCELERATE_FP8_FORMAT", "str", "HYBRID", "FP8 format: HYBRID or E4M3"),
    _v("ACCELERATE_FP8_AMAX_HISTORY_LEN", "int", 1024, "amax history length"),
    _v("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", "str", "most_recent", "amax compute algorithm"),
    _v("ACCELERATE_FP8_MARGIN", "int", 0, "scaling margin"),
    _v("ACCELERATE_FP8_INTERVAL", "int", 1, "scaling interval"),
    _v("ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION", "list", None, "three booleans: fprop, dgrad, wgrad"),
    _v("ACCELERATE_FP8_OPT_LEVEL", "str", "O2", "MS-AMP optimisation level"),
    _v("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "bool", False, "keep FP8 autocast in evaluation"),
    _v("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "bool", True, "torchao: all-gather FP8 weights under FSDP2"),
    _v("ACCELERATE_FP8_PAD_INNER_DIM", "bool", True, "torchao: pad inner dimensions to multiples of 16"),
    # parallelism config (tensor / context / data parallel sizes)
    _v("ACCELERATE_USE_PARALLELISM_CONFIG", "bool", False, "build a ParallelismConfig from the variables"),
    _v("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "int", 1, "data parallel replicate size"),
    _v("PARALLELISM_CONFIG_DP_SHARD_SIZE", "int", 1, "data parallel shard size"),
    _v("PARALLELISM_CONFIG_TP_SIZE", "int", 1, "tensor parallel size"),
    _v("PARALLELISM_CONFIG_EP_SIZE", "int", 1, "expert parallel size (accel extension)"),
    _v("PARALLELISM_CONFIG_CP_SIZE", "int", 1, "context parallel size"),
    _v("PARALLELISM_CONFIG_PP_SIZE", "int", 1, "pipeline parallel size (accel extension)"),
    _v("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "str", "allgather", "context parallel communication"),
    _v("PARALLELISM_CONFIG_CP_BACKEND", "str", "torch", "context parallel backend"),
    _v("PARALLELISM_CONFIG_SP_SIZE", "int", 1, "sequence parallel size"),
    _v("PARALLELISM_CONFIG_SP_BACKEND", "str", "deepspeed", "sequence parallel backend"),
    _v("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "str", None, "sequence length for sequence parallelism"),
    _v("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "bool", True, "sequence lengths vary between batches"),
    _v(
        "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
        "str",
        "sdpa",
        "attention implementation under sequence parallelism",
    ),
    # TPU
    _v("ACCELERATE_USE_TPU", "bool", False, "running on TPU through torch_xla"),
)

#: Every variable of the protocol, by name.
ENV_VARS: Mapping[str, EnvVar] = {var.name: var for var in _ALL}

#: Standard torch.distributed.run variables the launcher also sets (read by `accel_state.cluster`).
TORCH_DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def spec(name: str) -> EnvVar:
    """The declaration of ``name``; an error naming close matches when it is not part of the protocol."""
    try:
        return ENV_VARS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(ENV_VARS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"{name} is not an accel environment variable{hint}") from None


def read(name: str, environ: Mapping[str, str] | None = None, default: Any = ...) -> Any:
    """Typed value of ``name`` from ``environ`` (``os.environ`` by default), or its default."""
    var = spec(name)
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw == "":
        return var.default if default is ... else default
    return var.parse(raw)


def encode(values: Mapping[str, Any]) -> dict[str, str]:
    """Strings for the environment from ``{name: value}``; unknown names are an error, ``None`` is skipped."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        out[name] = spec(name).encode(value)
    return out

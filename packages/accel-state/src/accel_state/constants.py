"""File names and small constants of the documented checkpoint and weight layouts."""

from __future__ import annotations

import operator as _operator

MODEL_NAME = "pytorch_model"
"""Stem of a model's weights file in a ``save_state`` folder (``pytorch_model.bin``, ``pytorch_model_1.bin``)."""
OPTIMIZER_NAME = "optimizer"
"""Stem of an optimizer's state file in a ``save_state`` folder (``optimizer.bin``)."""
SCHEDULER_NAME = "scheduler"
"""Stem of a learning-rate scheduler's state file in a ``save_state`` folder (``scheduler.bin``)."""
SAMPLER_NAME = "sampler"
"""Stem of a data loader sampler's state file in a ``save_state`` folder (``sampler.bin``)."""
DATALOADER_NAME = "dl_state_dict"
"""Stem of a stateful data loader's state file in a ``save_state`` folder."""
RNG_STATE_NAME = "random_states"
"""Stem of the per-process random-number-generator states (``random_states_{rank}``)."""
SCALER_NAME = "scaler.pt"
"""File name of the mixed-precision gradient scaler's state in a ``save_state`` folder."""
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
"""File name pattern of a profiler trace; ``{suffix}`` is the process index."""

WEIGHTS_NAME = f"{MODEL_NAME}.bin"
"""File name of model weights saved with ``torch.save`` (not safetensors)."""
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
"""File name pattern of ``torch.save`` weight shards; ``{suffix}`` is the shard's part."""
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
"""File name of the index of ``torch.save`` weight shards (parameter name -> shard file)."""
SAFE_MODEL_NAME = "model"
"""Stem of a model's safetensors weights file (``model.safetensors``)."""
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
"""File name of model weights saved with safetensors."""
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
"""File name pattern of safetensors weight shards; ``{suffix}`` is the shard's part."""
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
"""File name of the index of safetensors weight shards (parameter name -> shard file)."""

FSDP_MODEL_NAME = "pytorch_model_fsdp"
"""Stem of an FSDP model's weights file or sharded folder in a ``save_state`` folder."""
CUSTOM_CHECKPOINT_PREFIX = "custom_checkpoint"
"""Stem of the state file of an object registered with ``register_for_checkpointing`` (``custom_checkpoint_{i}``)."""
CHECKPOINT_FOLDER_PREFIX = "checkpoint"
"""Stem of the folders ``save_state`` names itself with automatic naming (``checkpoint_{n}``)."""

SAGEMAKER_PYTORCH_VERSION = "1.10.2"
"""PyTorch version of the SageMaker training image that ``accel launch`` asks for."""
SAGEMAKER_PYTHON_VERSION = "py38"
"""Python version tag of the SageMaker training image."""
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
"""transformers version of the SageMaker training image."""
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]
"""SageMaker instance types that support its data-parallel library."""

STR_OPERATION_TO_FUNC = {
    ">": _operator.gt,
    ">=": _operator.ge,
    "==": _operator.eq,
    "!=": _operator.ne,
    "<=": _operator.le,
    "<": _operator.lt,
}
"""Comparison operators of version requirements -> their ``operator`` functions (``STR_OPERATION_TO_FUNC[">="](a, b)`` is ``a >= b``)."""

CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
"""Distributed types that run on CUDA devices."""
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    *CUDA_DISTRIBUTED_TYPES,
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_CPU",
    "MULTI_HPU",
]
"""Distributed types whose processes talk through ``torch.distributed``."""
TORCH_LAUNCH_PARAMS = [
    "nnodes",
    "nproc_per_node",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "module",
    "m",
    "no_python",
    "run_path",
    "log_dir",
    "r",
    "redirects",
    "t",
    "tee",
    "node_rank",
    "master_addr",
    "master_port",
]
"""Parameters of ``torch.distributed.run`` that ``accel launch`` passes through to it."""
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
"""First PyTorch version whose elastic launcher takes a log line prefix template."""
FSDP_PYTORCH_VERSION = "2.1.0"
"""Oldest PyTorch version FSDP runs on."""
FSDP2_PYTORCH_VERSION = "2.6.0"
"""Oldest PyTorch version FSDP2 (``fully_shard``) runs on."""
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
"""First PyTorch version whose profiler records Intel XPU activity."""
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
"""First PyTorch version whose profiler records MTIA activity."""
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
"""Oldest PyTorch version tensor parallelism works with."""
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
"""Oldest transformers version whose models' tensor-parallel plans accel applies."""
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
"""Oldest PyTorch version context parallelism works with."""

# Choices of the FSDP and DeepSpeed settings (as the config file and the launcher spell them).
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
"""FSDP sharding strategies, as the config file and ``accel launch`` spell them."""
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
"""FSDP auto-wrap policies, as the config file and ``accel launch`` spell them."""
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
"""FSDP backward prefetch policies, as the config file and ``accel launch`` spell them."""
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
"""FSDP state-dict types, as the config file and ``accel launch`` spell them."""
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
"""The state-dict types FSDP2 supports."""
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
"""Multi-node launchers DeepSpeed can start processes with."""
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
"""``torch.compile`` modes the dynamo settings accept."""


#: Names whose value needs torch: built on first access (module ``__getattr__``), so importing this
#: module stays free of torch.
_TORCH_CONSTANTS = ("SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",)


def __getattr__(name: str) -> object:
    if name == "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING":
        # Layers whose weights layerwise casting stores in a low-precision dtype and upcasts for forward.
        from torch import nn

        value = (
            nn.Conv1d,
            nn.Conv2d,
            nn.Conv3d,
            nn.ConvTranspose1d,
            nn.ConvTranspose2d,
            nn.ConvTranspose3d,
            nn.Linear,
        )
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

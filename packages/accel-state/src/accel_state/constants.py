"""File names and small constants of the documented checkpoint and weight layouts."""

from __future__ import annotations

MODEL_NAME = "pytorch_model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
DATALOADER_NAME = "dl_state_dict"
RNG_STATE_NAME = "random_states"
SCALER_NAME = "scaler.pt"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_MODEL_NAME = "model"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

FSDP_MODEL_NAME = "pytorch_model_fsdp"
CUSTOM_CHECKPOINT_PREFIX = "custom_checkpoint"
CHECKPOINT_FOLDER_PREFIX = "checkpoint"

SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

STR_OPERATION_TO_FUNC = {">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "<=": "le", "<": "lt"}

TORCH_DISTRIBUTED_OPERATION_TYPES = ["all_gather", "all_reduce", "broadcast", "reduce", "gather_object"]
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
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
FSDP_PYTORCH_VERSION = "2.1.0"
FSDP2_PYTORCH_VERSION = "2.6.0"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"


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

"""accel-state: process state, collective operations and the launcher's environment protocol.

Names are loaded on first use (module ``__getattr__``), so ``import accel_state`` stays cheap and
imports torch only when a name that needs it is touched.
"""

from __future__ import annotations

from accel_state.__about__ import __version__
from accel_state.lazy import lazy_exports

_EXPORTS: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _EXPORTS[name] = module


_export("state", "PartialState", "AcceleratorState", "GradientState", "is_initialized")
_export(
    "enums",
    "DistributedType",
    "PrecisionType",
    "ComputeEnvironment",
    "RNGType",
    "DynamoBackend",
    "SageMakerDistributedType",
)
_export("kwargs", "KwargsHandler", "InitProcessGroupKwargs")
_export("errors", "UnsafeCheckpointError", "CorruptCheckpointError", "CheckpointError")
_export(
    "operations",
    "gather",
    "gather_object",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "pad_across_processes",
    "pad_input_tensors",
    "copy_tensor_to_devices",
    "verify_operation",
    "chained_operation",
    "gather_tensor_shape",
    "CannotPadNestedTensorWarning",
)
_export(
    "nested",
    "DistributedOperationException",
    "TensorInformation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "ConvertOutputsToFp32",
    "find_batch_size",
    "ignorant_find_batch_size",
    "find_device",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "initialize_tensors",
    "is_namedtuple",
    "is_torch_tensor",
    "is_tensor_information",
    "listify",
    "recursively_apply",
    "send_to_device",
    "slice_tensors",
)
_export(
    "process",
    "wait_for_everyone",
    "main_process_first",
    "local_main_process_first",
    "on_main_process",
    "on_local_main_process",
    "on_last_process",
    "on_process",
    "on_local_process",
    "split_between_processes",
    "is_main_process",
    "is_local_main_process",
)
_export("random", "set_seed", "synchronize_rng_state", "synchronize_rng_states")
_export("logging", "get_logger", "MultiProcessAdapter")
_export("memory", "find_executable_batch_size", "release_memory", "clear_device_cache", "should_reduce_batch_size")
_export(
    "environment",
    "str_to_bool",
    "parse_flag_from_env",
    "parse_choice_from_env",
    "get_int_from_env",
    "patch_environment",
    "clear_environment",
    "are_libraries_initialized",
    "get_cpu_distributed_information",
    "check_os_kernel",
)
_export("versions", "compare_versions", "is_torch_version")
_export(
    "imports",
    *[
        "is_torch_available",
        "is_numpy_available",
        "is_safetensors_available",
        "is_yaml_available",
        "is_psutil_available",
        "is_tqdm_available",
        "is_rich_available",
        "is_huggingface_hub_available",
        "is_transformers_available",
        "is_timm_available",
        "is_datasets_available",
        "is_peft_available",
        "is_pandas_available",
        "is_matplotlib_available",
        "is_boto3_available",
        "is_sagemaker_available",
        "is_torchvision_available",
        "is_triton_available",
        "is_pynvml_available",
        "is_torchdata_available",
        "is_torchdata_stateful_dataloader_available",
        "is_deepspeed_available",
        "is_megatron_lm_available",
        "is_bnb_available",
        "is_8bit_bnb_available",
        "is_4bit_bnb_available",
        "is_transformer_engine_available",
        "is_msamp_available",
        "is_torchao_available",
        "is_lomo_available",
        "is_schedulefree_available",
        "is_tensorboard_available",
        "is_wandb_available",
        "is_comet_ml_available",
        "is_aim_available",
        "is_mlflow_available",
        "is_clearml_available",
        "is_dvclive_available",
        "is_trackio_available",
        "is_swanlab_available",
        "is_torch_xla_available",
        "is_ipex_available",
        "is_ccl_available",
        "is_pippy_available",
        "is_cuda_available",
        "is_mps_available",
        "is_xpu_available",
        "is_npu_available",
        "is_mlu_available",
        "is_musa_available",
        "is_sdaa_available",
        "is_hpu_available",
        "is_bf16_available",
        "is_fp16_available",
        "is_fp8_available",
        "is_mpi_available",
        "is_bitsandbytes_multi_backend_available",
    ],
)
_export(
    "constants",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "SCHEDULER_NAME",
    "SAMPLER_NAME",
    "RNG_STATE_NAME",
    "SCALER_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_MODEL_NAME",
    "WEIGHTS_PATTERN_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "FSDP_MODEL_NAME",
    "PROFILE_PATTERN_NAME",
)
_export("cluster", "ProcessEnvironment")
_export("install_hints", "install_hint")

__all__ = ["__version__", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

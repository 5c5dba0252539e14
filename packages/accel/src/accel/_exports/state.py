"""Names and module paths that accel-state provides to the meta-package."""

_S = "accel_state"

TOP_LEVEL = {
    "PartialState": f"{_S}.state",
    "AcceleratorState": f"{_S}.state",
    "GradientState": f"{_S}.state",
    "DistributedType": f"{_S}.enums",
    "InitProcessGroupKwargs": f"{_S}.kwargs",
    "find_executable_batch_size": f"{_S}.memory",
}

_OPS = [
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
    "CannotPadNestedTensorWarning",
]
_NESTED = [
    "DistributedOperationException",
    "TensorInformation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "find_batch_size",
    "ignorant_find_batch_size",
    "find_device",
    "get_data_structure",
    "honor_type",
    "initialize_tensors",
    "is_namedtuple",
    "is_torch_tensor",
    "is_tensor_information",
    "listify",
    "recursively_apply",
    "send_to_device",
    "slice_tensors",
]
_ENV = [
    "str_to_bool",
    "parse_flag_from_env",
    "parse_choice_from_env",
    "get_int_from_env",
    "patch_environment",
    "clear_environment",
    "are_libraries_initialized",
    "get_cpu_distributed_information",
    "check_os_kernel",
]
_ENUMS = [
    "DistributedType",
    "PrecisionType",
    "ComputeEnvironment",
    "RNGType",
    "DynamoBackend",
    "SageMakerDistributedType",
]
_CONSTANTS = [
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
]
_PROCESS = [
    "wait_for_everyone",
    "main_process_first",
    "local_main_process_first",
    "on_main_process",
    "on_local_main_process",
    "on_last_process",
    "on_process",
    "on_local_process",
]

UTILS: dict[str, str] = {}
UTILS.update({name: f"{_S}.operations" for name in _OPS})
UTILS.update({name: f"{_S}.nested" for name in _NESTED})
UTILS.update({name: f"{_S}.environment" for name in _ENV})
UTILS.update({name: f"{_S}.enums" for name in _ENUMS})
UTILS.update({name: f"{_S}.constants" for name in _CONSTANTS})
UTILS.update({name: f"{_S}.process" for name in _PROCESS})
UTILS.update({name: f"{_S}.random" for name in ("set_seed", "synchronize_rng_state", "synchronize_rng_states")})
UTILS.update(
    {
        name: f"{_S}.memory"
        for name in ("find_executable_batch_size", "release_memory", "clear_device_cache", "should_reduce_batch_size")
    }
)
UTILS.update({name: f"{_S}.versions" for name in ("compare_versions", "is_torch_version")})
UTILS.update({name: f"{_S}.kwargs" for name in ("KwargsHandler", "InitProcessGroupKwargs")})
UTILS["get_logger"] = f"{_S}.logging"


def _import_checks() -> dict[str, str]:
    # Every is_*_available check lives in accel_state.imports; listed here by name so the table stays static.
    names = [
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
    ]
    return {name: f"{_S}.imports" for name in names}


UTILS.update(_import_checks())

MODULES = {
    "accel.state": f"{_S}.state",
    "accel.logging": f"{_S}.logging",
    "accel.utils.operations": f"{_S}.operations",
    "accel.utils.memory": f"{_S}.memory",
    "accel.utils.constants": f"{_S}.constants",
    "accel.utils.imports": f"{_S}.imports",
    "accel.utils.environment": f"{_S}.environment",
    "accel.utils.random": f"{_S}.random",
    "accel.utils.versions": f"{_S}.versions",
    "accel.utils.env_vars": f"{_S}.env_vars",
}

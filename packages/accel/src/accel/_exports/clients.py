"""Documented names that libraries built on the documented system import (transformers, peft, ported
scripts), gathered from the packages that own them (accel-train's, ``accel.utils.other`` included, come from its
own lists: see ``train.py``). Registered after the placeholders and before
the owners' own tables, so an owner that later exports the same name keeps its entry."""

_S = "accel_state"

TOP_LEVEL: dict[str, str] = {
    "synchronize_rng_states": f"{_S}.random",
    "is_rich_available": f"{_S}.imports",
}

_ENVIRONMENT = [
    "purge_accelerate_environment",
    "get_current_device_type",
    "get_gpu_info",
    "set_numa_affinity",
    "check_cuda_p2p_ib_support",
]
_PROBES = [
    "is_pytest_available",
    "is_weights_only_available",
    "is_rocm_available",
    "is_xccl_available",
    "is_neuron_available",
    "is_habana_gaudi1",
    "is_import_timer_available",
    "is_torchvision_v2_available",
    "is_amdsmi_available",
]
_CONSTANTS = [
    "TORCH_LAUNCH_PARAMS",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "STR_OPERATION_TO_FUNC",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_STATE_DICT_TYPE",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "TORCH_DYNAMO_MODES",
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "FSDP_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "CUSTOM_CHECKPOINT_PREFIX",
    "DATALOADER_NAME",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
]

UTILS: dict[str, str] = {}
UTILS.update({name: f"{_S}.environment" for name in _ENVIRONMENT})
UTILS.update({name: f"{_S}.imports" for name in _PROBES})
UTILS.update({name: f"{_S}.constants" for name in _CONSTANTS})
UTILS["tqdm"] = f"{_S}.progress_bar"
UTILS["convert_bytes"] = "accel_bigmodel.estimate"

MODULES: dict[str, str] = {
    "accel.utils.tqdm": f"{_S}.progress_bar",
    "accel.utils.rich": "accel_launch.rich_traceback",
    "accel.memory_utils": f"{_S}.memory",
}

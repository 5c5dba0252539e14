"""Load and run PyTorch models bigger than memory: device maps, offload, hooks, sharded checkpoints.

Names are loaded on first use (module ``__getattr__``), so ``import accel_bigmodel`` does not import torch.
"""

from __future__ import annotations

from accel_bigmodel.__about__ import __version__
from accel_state.lazy import lazy_exports

_EXPORTS: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _EXPORTS[name] = module


_export("empty", "init_empty_weights", "init_on_device")
_export(
    "big_modeling",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "load_checkpoint_and_dispatch",
    "attach_layerwise_casting_hooks",
)
_export(
    "hooks",
    "ModelHook",
    "SequentialHook",
    "AlignDevicesHook",
    "CpuOffload",
    "UserCpuOffloadHook",
    "LayerwiseCastingHook",
    "add_hook_to_module",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "attach_execution_device_hook",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
)
_export("alignment", "has_offloaded_params", "align_module_device")
_export(
    "planning",
    "infer_auto_device_map",
    "get_balanced_memory",
    "check_device_map",
    "clean_device_map",
)
_export("device_memory", "get_max_memory")
_export(
    "sizes",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "get_max_layer_size",
    "calculate_maximum_sizes",
    "dtype_byte_size",
    "convert_file_size_to_int",
    "named_module_tensors",
    "id_tensor_storage",
    "get_module_leaves",
    "get_non_persistent_buffers",
)
_export(
    "tied",
    "find_tied_parameters",
    "retie_parameters",
    "check_tied_parameters_on_same_device",
    "check_tied_parameters_in_config",
)
_export("tensors", "set_module_tensor_to_device")
_export("checkpoint", "load_state_dict")
_export("loading", "load_checkpoint_in_model", "CheckpointMismatchError")
_export("tensor_io", "CheckpointError", "CorruptCheckpointError")
_export("safe_write", "CheckpointWriteError")
_export(
    "offload",
    "offload_weight",
    "load_offloaded_weight",
    "save_offload_index",
    "offload_state_dict",
    "load_offloaded_weights",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
)
_export(
    "modeling",
    "get_state_dict_offloaded_model",
    "get_module_children_bottom_up",
    "check_device_same",
    "get_state_dict_from_offload",
)
_export("sharding", "parse_size", "split_state_dict_into_shards", "save_sharded", "ShardPlan")
_export("inference", "prepare_pippy")
_export("estimate", "create_empty_model", "estimate_memory", "EstimateRow", "ModelBuildError")

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

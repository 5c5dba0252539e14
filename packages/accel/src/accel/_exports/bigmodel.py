"""Names and module paths that accel-bigmodel provides to the meta-package."""

_B = "accel_bigmodel"

TOP_LEVEL = {
    "init_empty_weights": f"{_B}.empty",
    "init_on_device": f"{_B}.empty",
    "cpu_offload": f"{_B}.big_modeling",
    "cpu_offload_with_hook": f"{_B}.big_modeling",
    "disk_offload": f"{_B}.big_modeling",
    "dispatch_model": f"{_B}.big_modeling",
    "load_checkpoint_and_dispatch": f"{_B}.big_modeling",
    "infer_auto_device_map": f"{_B}.planning",
    "load_checkpoint_in_model": f"{_B}.loading",
    "prepare_pippy": f"{_B}.inference",
}

UTILS: dict[str, str] = {}
UTILS.update(
    {
        name: f"{_B}.sizes"
        for name in (
            "calculate_maximum_sizes",
            "compute_module_sizes",
            "compute_module_total_buffer_size",
            "get_max_layer_size",
            "named_module_tensors",
            "dtype_byte_size",
            "convert_file_size_to_int",
            "id_tensor_storage",
            "get_module_leaves",
            "get_non_persistent_buffers",
        )
    }
)
UTILS.update(
    {
        name: f"{_B}.planning"
        for name in ("infer_auto_device_map", "get_balanced_memory", "check_device_map", "clean_device_map")
    }
)
UTILS["get_max_memory"] = f"{_B}.device_memory"
UTILS.update(
    {
        name: f"{_B}.tied"
        for name in (
            "find_tied_parameters",
            "retie_parameters",
            "check_tied_parameters_on_same_device",
            "check_tied_parameters_in_config",
        )
    }
)
UTILS["set_module_tensor_to_device"] = f"{_B}.tensors"
UTILS["load_state_dict"] = f"{_B}.checkpoint"
UTILS["load_checkpoint_in_model"] = f"{_B}.loading"
UTILS.update(
    {
        name: f"{_B}.offload"
        for name in (
            "offload_weight",
            "load_offloaded_weight",
            "save_offload_index",
            "offload_state_dict",
            "load_offloaded_weights",
            "OffloadedWeightsLoader",
            "PrefixedDataset",
            "extract_submodules_state_dict",
        )
    }
)
UTILS.update(
    {
        name: f"{_B}.modeling"
        for name in (
            "get_state_dict_offloaded_model",
            "get_module_children_bottom_up",
            "check_device_same",
            "get_state_dict_from_offload",
        )
    }
)
UTILS.update({name: f"{_B}.alignment" for name in ("has_offloaded_params", "align_module_device")})

MODULES = {
    "accel.big_modeling": f"{_B}.big_modeling",
    "accel.hooks": f"{_B}.hooks",
    "accel.utils.modeling": f"{_B}.modeling",
    "accel.utils.offload": f"{_B}.offload",
    "accel.inference": f"{_B}.inference",
    "accel.commands.estimate": f"{_B}.commands.estimate",
}

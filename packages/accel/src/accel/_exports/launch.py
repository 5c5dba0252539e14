"""Names and module paths that accel-launch provides to the meta-package."""

_L = "accel_launch"

TOP_LEVEL: dict[str, str] = {
    "notebook_launcher": f"{_L}.launchers",
    "debug_launcher": f"{_L}.launchers",
    "verify": f"{_L}.verify",
}

UTILS: dict[str, str] = {
    "write_basic_config": f"{_L}.commands.config.default",
    "PrepareForLaunch": f"{_L}.launch_utils",
    "prepare_simple_launcher_cmd_env": f"{_L}.launch_utils",
    "prepare_multi_gpu_env": f"{_L}.launch_utils",
    "prepare_deepspeed_cmd_env": f"{_L}.launch_utils",
    "prepare_tpu": f"{_L}.launch_utils",
    "prepare_sagemager_args_inputs": f"{_L}.launch_utils",
    "convert_dict_to_env_variables": f"{_L}.launch_utils",
    "is_port_in_use": f"{_L}.launch_utils",
}

MODULES: dict[str, str] = {
    "accel.commands.launch": f"{_L}.commands.launch",
    "accel.commands.config": f"{_L}.commands.config",
    "accel.commands.config.config_args": f"{_L}.commands.config.config_args",
    "accel.commands.env": f"{_L}.commands.env",
    "accel.commands.tpu": f"{_L}.commands.tpu",
    "accel.commands.to_fsdp2": f"{_L}.commands.to_fsdp2",
    "accel.commands.verify": f"{_L}.commands.verify",
    "accel.launchers": f"{_L}.launchers",
    "accel.utils.launch": f"{_L}.launch_utils",
}

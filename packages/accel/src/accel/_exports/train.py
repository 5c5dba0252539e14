"""Names and module paths that accel-train provides to the meta-package."""

_T = "accel_train"

TOP_LEVEL: dict[str, str] = {
    "Accelerator": f"{_T}.accelerator",
    "AutocastKwargs": f"{_T}.kwargs_handlers",
    "DDPCommunicationHookType": f"{_T}.kwargs_handlers",
    "DistributedDataParallelKwargs": f"{_T}.kwargs_handlers",
    "GradScalerKwargs": f"{_T}.kwargs_handlers",
    "ProfileKwargs": f"{_T}.kwargs_handlers",
    "DeepSpeedPlugin": f"{_T}.parallel_plugins",
    "FullyShardedDataParallelPlugin": f"{_T}.parallel_plugins",
    "ParallelismConfig": f"{_T}.parallel_plugins",
}

_KWARGS = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "ProfileKwargs",
    "FP8RecipeKwargs",
    "TERecipeKwargs",
    "MSAMPRecipeKwargs",
    "AORecipeKwargs",
]
_PLUGINS = ["GradientAccumulationPlugin", "ProjectConfiguration", "TorchDynamoPlugin"]
_PARALLEL = [
    "FullyShardedDataParallelPlugin",
    "DeepSpeedPlugin",
    "MegatronLMPlugin",
    "TorchTensorParallelPlugin",
    "ParallelismConfig",
    "TorchTensorParallelConfig",
    "TorchContextParallelConfig",
]

UTILS: dict[str, str] = {}
UTILS.update({name: f"{_T}.kwargs_handlers" for name in _KWARGS})
UTILS.update({name: f"{_T}.plugins" for name in _PLUGINS})
UTILS.update({name: f"{_T}.parallel_plugins" for name in _PARALLEL})
UTILS["merge_fsdp_weights"] = f"{_T}.merge"
UTILS["save"] = f"{_T}.checkpoint_io"
UTILS["load"] = f"{_T}.checkpoint_io"

MODULES: dict[str, str] = {
    "accel.accelerator": f"{_T}.accelerator",
    "accel.optimizer": f"{_T}.optimizer",
    "accel.scheduler": f"{_T}.scheduler",
    "accel.local_sgd": f"{_T}.local_sgd",
    "accel.checkpointing": f"{_T}.checkpointing",
    "accel.parallelism_config": f"{_T}.parallelism_config",
    "accel.test_utils": f"{_T}.test_utils",
    "accel.commands.test": f"{_T}.commands.test",
    "accel.commands.merge": f"{_T}.commands.merge",
}

# FSDP utilities (issue 11): documented names on accel.utils, and the accel.utils.fsdp_utils module path.
_FSDP_UTILS = [
    "save_fsdp_model",
    "load_fsdp_model",
    "save_fsdp_optimizer",
    "load_fsdp_optimizer",
    "enable_fsdp_ram_efficient_loading",
    "disable_fsdp_ram_efficient_loading",
    "get_fsdp2_grad_scaler",
    "fsdp2_prepare_model",
    "fsdp2_load_full_state_dict",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_switch_optimizer_parameters",
    "ensure_weights_retied",
    "get_parameters_from_modules",
]
UTILS.update({name: f"{_T}.fsdp_utils" for name in _FSDP_UTILS})
MODULES["accel.utils.fsdp_utils"] = f"{_T}.fsdp_utils"
# DeepSpeed (accel-train's deepspeed strategy): the documented helpers under accel.utils and the
# accel.utils.deepspeed module path.
_DEEPSPEED = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "deepspeed_required",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]
UTILS.update({name: f"{_T}.deepspeed_utils" for name in _DEEPSPEED})
MODULES["accel.utils.deepspeed"] = f"{_T}.deepspeed_utils"

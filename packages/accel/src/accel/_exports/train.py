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

"""accel-train: the Accelerator, its optimizer and scheduler wrappers, plugins and checkpoints.

Names load on first use (module ``__getattr__``): ``import accel_train`` does no work.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports
from accel_train.__about__ import __version__

_EXPORTS: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _EXPORTS[name] = module


_export("accelerator", "Accelerator")
_export("optimizer", "AcceleratedOptimizer")
_export("scheduler", "AcceleratedScheduler")
_export("local_sgd", "LocalSGD")
_export(
    "kwargs_handlers",
    "AutocastKwargs",
    "DistributedDataParallelKwargs",
    "DDPCommunicationHookType",
    "GradScalerKwargs",
    "ProfileKwargs",
    "FP8RecipeKwargs",
    "TERecipeKwargs",
    "MSAMPRecipeKwargs",
    "AORecipeKwargs",
)
_export("plugins", "GradientAccumulationPlugin", "ProjectConfiguration", "TorchDynamoPlugin")
_export(
    "parallel_plugins",
    "FullyShardedDataParallelPlugin",
    "DeepSpeedPlugin",
    "MegatronLMPlugin",
    "TorchTensorParallelPlugin",
    "ParallelismConfig",
    "TorchTensorParallelConfig",
    "TorchContextParallelConfig",
    "BackendNotAvailableError",
)
_export("checkpointing", "CheckpointMismatchError")
_export("checkpoint_io", "UnsafeCheckpointError")
_export("merge", "merge_fsdp_weights")
_export(
    "fsdp_utils",
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
)
_export(
    "deepspeed_utils",
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "deepspeed_required",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
)
_export(
    "strategies.megatron",
    "MegatronLMDummyScheduler",
    "MegatronLMDummyDataLoader",
    "AbstractTrainStep",
    "GPTTrainStep",
    "BertTrainStep",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
)

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

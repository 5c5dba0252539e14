"""accel-train: the Accelerator, its optimizer and scheduler wrappers, plugins and checkpoints.

Names load on first use (module ``__getattr__``): ``import accel_train`` does no work.

Each backend is one folder under ``strategies/``. The module paths of earlier releases
(``accel_train.fsdp_utils``, ``accel_train.deepspeed_utils``, ``accel_train.parallelism_config``, ...)
stay importable: `MOVED_MODULES` names the real module behind each, and importing the old path
gives that very module object (so ``mock.patch("accel_train.fsdp_utils.X")`` patches the running code).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

from accel_state.lazy import lazy_exports
from accel_train.__about__ import __version__

_S = "accel_train.strategies"

#: Old module path -> the module that now holds its code (one entry per moved module).
MOVED_MODULES: dict[str, str] = {
    "accel_train.fsdp_plugin": f"{_S}.fsdp.plugin",
    "accel_train.fsdp_state": f"{_S}.fsdp.state",
    "accel_train.fsdp_utils": f"{_S}.fsdp.utils",
    "accel_train.fsdp_wrap": f"{_S}.fsdp.wrap",
    "accel_train.merge": "accel_train.checkpoint.merge",
    f"{_S}.fsdp.merge": "accel_train.checkpoint.merge",
    f"{_S}.deepspeed.merge": "accel_train.checkpoint.deepspeed_merge",
    f"{_S}.deepspeed.checkpoint": "accel_train.checkpoint.deepspeed_io",
    f"{_S}.deepspeed.reshard": "accel_train.checkpoint.deepspeed_universal",
    "accel_train.deepspeed_plugin": f"{_S}.deepspeed.plugin",
    "accel_train.deepspeed_config": f"{_S}.deepspeed.config",
    "accel_train.deepspeed_utils": f"{_S}.deepspeed.utils",
    "accel_train.strategies.nd_parallel": f"{_S}.nd.strategy",
    "accel_train.tensor_parallel": f"{_S}.nd.tensor_parallel",
    "accel_train.parallelism_config": f"{_S}.nd.config",
    "accel_train.megatron_plugin": f"{_S}.megatron.plugin",
}


class _MovedLoader(importlib.abc.Loader):
    """Loads an old module path by importing the new one and returning that very module."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target executed when it was imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of `MOVED_MODULES` (nothing else)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        real = MOVED_MODULES.get(fullname)
        if real is None:
            return None
        real_spec = importlib.util.find_spec(real)
        origin = real_spec.origin if real_spec is not None else None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(real), origin=origin)


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())

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
    "PipelineParallelConfig",
    "DeepSpeedSequenceParallelConfig",
    "BackendNotAvailableError",
)
_export("checkpointing", "CheckpointMismatchError")
_export("checkpoint.file_io", "UnsafeCheckpointError")
_export("checkpoint.integrity", "CorruptCheckpointError")
_export("checkpoint.background", "AsyncCheckpointError")
_export("weights.unloaded", "UnloadedWeightsError")
_export("checkpoint.merge", "merge_fsdp_weights")
_export(
    "strategies.fsdp.utils",
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
)
_export(
    "strategies.deepspeed.utils",
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

# -- what this package gives the meta-package ``accel`` (the one source of its accel-train tables) ----------
# ``accel/_exports/train.py`` is generated from these by ``python -m accel._exports.generate``; a test of
# the meta-package checks that it is up to date. A name's module comes from ``_EXPORTS`` unless given.

#: Names on ``accel`` itself.
META_TOP_LEVEL: tuple[str, ...] = (
    "Accelerator",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "ProfileKwargs",
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "ParallelismConfig",
)
#: Names on ``accel.utils``: every exported name of these modules of ``_EXPORTS`` ...
META_UTILS_MODULES: tuple[str, ...] = (
    "kwargs_handlers",
    "plugins",
    "parallel_plugins",
    "checkpoint.merge",
    "strategies.fsdp.utils",
    "strategies.deepspeed.utils",
    "strategies.megatron",
)
#: ... these names of other modules (name -> module) ...
META_UTILS_EXTRA: dict[str, str] = {"save": "checkpoint.file_io", "load": "checkpoint.file_io"}
#: ... and every name of these modules' ``__all__`` that this package defines (``accel.utils.other``).
META_UTILS_ALL_OF: tuple[str, ...] = ("other",)
#: Documented module paths -> the module of this package behind each.
META_MODULES: dict[str, str] = {
    "accel.accelerator": "accelerator",
    "accel.optimizer": "optimizer",
    "accel.scheduler": "scheduler",
    "accel.local_sgd": "local_sgd",
    "accel.checkpointing": "checkpointing",
    "accel.parallelism_config": "strategies.nd.config",
    "accel.test_utils": "test_utils",
    "accel.commands.test": "commands.test",
    "accel.commands.merge": "commands.merge",
    "accel.utils.fsdp_utils": "strategies.fsdp.utils",
    "accel.utils.deepspeed": "strategies.deepspeed.utils",
    "accel.utils.megatron_lm": "strategies.megatron",
    "accel.utils.other": "other",
    "accel.utils.torch_xla": "other",
}


def meta_exports() -> dict[str, dict[str, str]]:
    """This package's tables for the meta-package: ``TOP_LEVEL`` / ``UTILS`` (name -> module) and
    ``MODULES`` (documented path -> module), with full module names.

    Imports the modules of `META_UTILS_ALL_OF` (to read their ``__all__``): for the generator
    and the tests, never at import time.
    """
    full = {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}
    utils = {name: module for name, module in full.items() if _EXPORTS[name] in META_UTILS_MODULES}
    utils.update({name: f"{__name__}.{module}" for name, module in META_UTILS_EXTRA.items()})
    for module_name in META_UTILS_ALL_OF:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for name in module.__all__:
            defined_in = getattr(getattr(module, name), "__module__", None) or ""
            if name not in utils and defined_in.startswith(f"{__name__}."):
                utils[name] = module.__name__
    return {
        "TOP_LEVEL": {name: full[name] for name in META_TOP_LEVEL},
        "UTILS": utils,
        "MODULES": {path: f"{__name__}.{module}" for path, module in META_MODULES.items()},
    }


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

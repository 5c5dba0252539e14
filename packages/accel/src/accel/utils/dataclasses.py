"""``accel.utils.dataclasses``: the documented dataclasses and enums, gathered from their owners.

Unlike the other ``accel.utils`` sub-modules this one is not an alias: its names live in several
packages (enums in accel-state, ``DataLoaderConfiguration`` in accel-data, ``LoggerType`` in
accel-tracking, plugins and kwargs handlers in accel-train), so it loads each on first use.
"""

from __future__ import annotations

from typing import Any

from accel import _aliases, _exports

_NAMES = (
    "ComputeEnvironment DistributedType DynamoBackend PrecisionType RNGType SageMakerDistributedType "
    "KwargsHandler InitProcessGroupKwargs DataLoaderConfiguration LoggerType "
    "AutocastKwargs DDPCommunicationHookType DistributedDataParallelKwargs GradScalerKwargs ProfileKwargs "
    "FP8RecipeKwargs TERecipeKwargs MSAMPRecipeKwargs AORecipeKwargs GradientAccumulationPlugin "
    "ProjectConfiguration TorchDynamoPlugin FullyShardedDataParallelPlugin DeepSpeedPlugin MegatronLMPlugin "
    "TorchTensorParallelPlugin DeepSpeedSequenceParallelConfig BnbQuantizationConfig CustomDtype get_module_class_from_name"
).split()

_TABLE = {name: _exports.UTILS[name] for name in _NAMES if name in _exports.UTILS}

__all__ = sorted(_TABLE)


def __getattr__(name: str) -> Any:
    value = _aliases.lazy_attribute("accel.utils.dataclasses", name, _TABLE)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

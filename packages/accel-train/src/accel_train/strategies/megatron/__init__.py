"""Megatron-LM on megatron-core's public API: plugin, config translation, train steps, strategy.

Importing this package imports neither torch nor megatron-core; the documented names resolve lazily.
"""

from __future__ import annotations

from typing import Any

from accel_train.strategies.megatron.plugin import MegatronLMPlugin

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
]

_LAZY = {
    "AbstractTrainStep": "train_step",
    "BertTrainStep": "train_step",
    "GPTTrainStep": "train_step",
    "T5TrainStep": "train_step",
    "MegatronLMDummyDataLoader": "utils",
    "MegatronLMDummyScheduler": "utils",
    "avg_losses_across_data_parallel_group": "utils",
    "gather_across_data_parallel_groups": "utils",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The parallelism plugins under one name, and the error for a backend that is not available.

Each plugin lives in its own module (`plugin`, `plugin`,
`plugin`, `config`,
`config`); this module gathers them for code that imports them from one place.
"""

from __future__ import annotations

from accel_train.strategies.deepspeed.plugin import DeepSpeedPlugin
from accel_train.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from accel_train.strategies.megatron.plugin import MegatronLMPlugin
from accel_train.strategies.nd.config import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from accel_train.strategies.pipeline.config import PipelineParallelConfig

__all__ = [
    "BackendNotAvailableError",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "FullyShardedDataParallelPlugin",
    "MegatronLMPlugin",
    "ParallelismConfig",
    "PipelineParallelConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "not_available",
]


class BackendNotAvailableError(NotImplementedError):
    """A documented backend whose implementation comes in a later release of accel."""


def not_available(backend: str) -> BackendNotAvailableError:
    return BackendNotAvailableError(
        f"{backend} is not available yet in accel; coming in a later release. Its plugin was accepted and "
        "validated, but preparing objects with it is not supported. Run without it (single process or DDP)."
    )

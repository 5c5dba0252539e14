"""accel-data: sharded, resumable, device-placing data loaders for distributed PyTorch.

Names are loaded on first use (module ``__getattr__``): ``import accel_data`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from accel_data.__about__ import __version__

_EXPORTS: dict[str, str] = {
    "prepare_data_loader": "data_loader",
    "skip_first_batches": "data_loader",
    "get_sampler": "data_loader",
    "BatchSamplerShard": "samplers",
    "IterableDatasetShard": "samplers",
    "SeedableRandomSampler": "samplers",
    "SkipBatchSampler": "samplers",
    "DataLoaderShard": "loaders",
    "DataLoaderStateMixin": "loaders",
    "SkipDataLoader": "loaders",
    "DataLoaderDispatcher": "dispatch",
    "DataLoaderConfiguration": "config",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"accel_data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

"""accel-data: sharded, resumable, device-placing data loaders for distributed PyTorch.

Names are loaded on first use (module ``__getattr__``): ``import accel_data`` does not import torch.
"""

from __future__ import annotations

from accel_data.__about__ import __version__
from accel_state.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

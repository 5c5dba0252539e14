"""The ND-parallel backend (tensor, context and sharded/replicated data parallelism on a device mesh).

- `config`: ``ParallelismConfig`` and its TP/CP configs, mesh building (also
  ``accel_train.parallelism_config`` / ``accel.parallelism_config``);
- `tensor_parallel`: tensor-parallel plans; `strategy`: ``NDParallelStrategy``.

Data-parallel sharding goes through the FSDP backend's FSDP2 path, checkpoints through its state module.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports

_EXPORTS = {"NDParallelStrategy": "strategy"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

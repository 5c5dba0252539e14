"""The FSDP backend (FSDP 1 and 2): everything that knows about ``FullyShardedDataParallel`` lives here.

- `plugin`: ``FullyShardedDataParallelPlugin`` (settings, read from the launcher's variables);
- `strategy`: ``FSDPStrategy`` (set-up, training step, checkpoint entries);
- `wrap`: wrap units and policies; `state`: full and DCP-sharded state dicts;
- `utils`: the documented ``save_fsdp_model``, ``fsdp2_prepare_model``, ... (also
  ``accel_train.fsdp_utils`` / ``accel.utils.fsdp_utils``); `merge`: ``merge_fsdp_weights``.

Importing this package does no work: the strategy's names load on first use.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports

_EXPORTS = {"FSDPStrategy": "strategy", "fsdp_grad_scaler": "strategy"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

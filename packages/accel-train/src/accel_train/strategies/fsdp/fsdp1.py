"""FSDP1 (``FullyShardedDataParallel``) helpers that act on a wrapped model's flat parameters.

FSDP1 keeps each unit's parameters in one flat parameter per process (this process's shard); the
original parameters are views into it (``use_orig_params=True``) or hidden behind it.
"""

from __future__ import annotations

import torch

from accel_train.strategies.fsdp.fsdp2 import is_quantized_parameter, warn_upcast

__all__ = ["upcast_flat_parameters"]


def upcast_flat_parameters(model: torch.nn.Module) -> list[str]:
    """Turn FSDP1's low-precision flat parameters (this process's shards) into float32, warn once naming
    the parameters they hold, and return those names.

    The documented behaviour: with mixed precision, FSDP keeps float32 weights and computes in the low
    precision (FSDP2 does the same through ``fsdp2.upcast_to_float32``). Done after wrapping, on the
    shards, so no process ever holds an unsharded float32 copy of the model. A flat parameter holding a
    quantized weight (``fsdp2.is_quantized_parameter``) is left as it is.

    Args:
        model: the model wrapped by ``FullyShardedDataParallel``, before its first forward.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    upcast: list[str] = []
    for module in FSDP.fsdp_modules(model):
        handle = module._handle
        if handle is None:
            continue
        flat = handle.flat_param
        if flat.dtype == torch.float32 or not flat.is_floating_point() or flat.device.type == "meta":
            continue
        if not flat.requires_grad:  # frozen weights are not trained: nothing to keep in float32
            continue
        if any(is_quantized_parameter(param) for param in getattr(flat, "_params", None) or ()):
            continue  # packed 4-bit codes (FSDP-QLoRA, use_orig_params): a cast would destroy them
        flat.data = flat.data.to(torch.float32)
        handle._orig_param_dtype = torch.float32
        if handle._use_orig_params:
            handle._use_sharded_views()  # the original parameters are views into the flat one: new dtype
        upcast.extend(flat._fqns)
    warn_upcast(upcast)
    return upcast

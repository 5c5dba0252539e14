"""The fp16 gradient scaler of the ND strategy: torch's sharded scaler, taking DTensor and plain gradients
in one optimizer.

Tensor parallelism splits only the layers of its plan; the others keep plain tensors, so an optimizer
holds DTensor gradients beside plain ones of the same device and dtype. torch's unscale runs one fused
check over each (device, dtype) group, which refuses a group mixing the two. Unscaling is elementwise,
so each DTensor is unscaled through its local shard (the same storage); whether any rank found an inf or
NaN is then combined over the processes by the sharded scaler, as for FSDP's shards.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ = ["MeshGradScaler"]


class MeshGradScaler(ShardedGradScaler):
    """`ShardedGradScaler` whose unscale accepts DTensor gradients mixed with plain ones."""

    def _unscale_grads_(  # type: ignore[override]
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        from torch.distributed.tensor import DTensor

        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad: Any = param.grad
                    if grad is None:
                        continue
                    if not allow_fp16 and grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    local = grad.to_local() if isinstance(grad, DTensor) else grad
                    if local.is_sparse:
                        local = local.coalesce()._values()
                    groups.setdefault((local.device, local.dtype), []).append(local)
            found: dict[torch.device, torch.Tensor] = {}
            for (device, _), grads in groups.items():
                if device not in found:
                    found[device] = found_inf if found_inf.device == device else found_inf.to(device)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found[device], inv_scale.to(device))
        if not found:  # no gradient on this rank: it still reports, for the combined check
            found[found_inf.device] = found_inf
        return found

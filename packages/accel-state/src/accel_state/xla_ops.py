"""The collectives of `accel_state.operations` when the run is on XLA: torch_xla's own.

On XLA the replicas' tensors live on torch_xla's device and are exchanged by torch_xla's collectives
(``xm.all_gather``, ``xm.all_reduce``, ``xm.collective_broadcast``), which become part of the traced
graph; ``torch.distributed`` is not used for them. `on_xla()` is the switch `operations` asks first:
it reads the shared state only, never imports torch_xla.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["on_xla", "xla_broadcast", "xla_gather", "xla_reduce"]


def on_xla() -> bool:
    """True when this process's `PartialState` runs on XLA (False before any state exists)."""
    from accel_state.enums import DistributedType
    from accel_state.state import PartialState

    shared = PartialState._shared_state
    return bool(shared.get("_initialized")) and shared.get("distributed_type") == DistributedType.XLA


def _xm() -> Any:
    import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

    return xm


def xla_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every replica's ``tensor`` concatenated along dim 0 (a 0-d tensor counts as one row)."""
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    return _xm().all_gather(tensor.contiguous(), dim=0)


def xla_reduce(tensor: torch.Tensor, reduction: str, scale: float, world_size: int) -> torch.Tensor:
    """``tensor`` reduced over the replicas (``sum``/``mean``/``max``/``min``/``none``), times ``scale``."""
    xm = _xm()
    out = tensor.clone()
    if reduction != "none":
        op = {"sum": xm.REDUCE_SUM, "mean": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}[reduction]
        out = xm.all_reduce(op, out)
    if reduction == "mean":
        out = out / world_size
    return out * scale if scale != 1.0 else out


def xla_broadcast(tensor: torch.Tensor, from_process: int) -> torch.Tensor:
    """Replica ``from_process``'s ``tensor`` on every replica."""
    out = tensor.clone().contiguous()
    _xm().collective_broadcast([out], root_ordinal=from_process)
    return out

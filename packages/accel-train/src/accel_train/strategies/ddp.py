"""DistributedDataParallel: every process holds the whole model and gradients are all-reduced."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accel_train.kwargs_handlers import DistributedDataParallelKwargs
from accel_train.strategies.base import Strategy
from accel_train.wrappers import is_compiled

__all__ = ["DDPStrategy"]


def _ddp(model: Any) -> torch.nn.parallel.DistributedDataParallel | None:
    inner = model._orig_mod if is_compiled(model) else model
    return inner if isinstance(inner, torch.nn.parallel.DistributedDataParallel) else None


class DDPStrategy(Strategy):
    """``DistributedDataParallel`` with the user's ``DistributedDataParallelKwargs`` and comm hook.

    With one process (a multi-device type launched alone) the model is left unwrapped.
    """

    name = "ddp"
    main_process_saves_alone = True

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.state.num_processes <= 1 or not any(p.requires_grad for p in model.parameters()):
            return model
        handler: DistributedDataParallelKwargs = self.handlers.get("ddp_handler") or DistributedDataParallelKwargs()
        device = self.device
        device_ids = [device.index] if device.type not in ("cpu", "mps") and device.index is not None else None
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=device.index if device_ids else None,
            **handler.ddp_arguments(),
        )
        handler.register_comm_hook(wrapped)
        return wrapped

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        ddp = _ddp(model)
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def force_sync(self, model: torch.nn.Module) -> Any:
        ddp = _ddp(model)
        if ddp is None:
            yield
            return
        old_backward, old_forward = ddp.require_backward_grad_sync, ddp.require_forward_param_sync
        ddp.require_backward_grad_sync = True
        ddp.require_forward_param_sync = True
        ddp.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            ddp.require_backward_grad_sync = old_backward
            ddp.require_forward_param_sync = old_forward

    def join(self, joinables: list[Any]) -> contextlib.AbstractContextManager[Any]:
        if self.state.num_processes <= 1:
            return contextlib.nullcontext()
        from torch.distributed.algorithms import Join

        return Join(joinables)

"""Local SGD: train without per-step gradient sync and average the parameters every few steps."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

from accel_state.enums import DistributedType

__all__ = ["LocalSGD"]

_SUPPORTED = {
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_HPU,
}


class LocalSGD:
    """Context manager: DDP gradient sync is off inside; parameters are averaged every ``local_sgd_steps``.

    Call `step()` after each optimizer step. On exit the parameters are averaged once more.

    Args:
        accelerator: the Accelerator of the run.
        model: the prepared model.
        local_sgd_steps: optimizer steps between two parameter averages.
        enabled: turn the behaviour off without changing the loop.
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError(
                f"LocalSGD works with plain multi-CPU/multi-GPU DDP, not {accelerator.distributed_type}"
            )
        if not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an int >= 1, got {local_sgd_steps!r}")
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self._sync_and_avg_model_params()
            self._no_sync.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps``."""
        self.num_steps += 1
        if not self.enabled:
            return
        if self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad(), self.accelerator.autocast():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")

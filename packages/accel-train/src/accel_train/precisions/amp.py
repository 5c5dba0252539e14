"""fp16 and bf16 through ``torch.autocast``, with a gradient scaler in fp16.

The scaler comes from the strategy's factory (``torch.amp.GradScaler`` by default; a sharded
strategy gives a sharded scaler), so the precision never needs to know how the model is spread.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import torch

from accel_train.kwargs_handlers import AutocastKwargs, GradScalerKwargs
from accel_train.precisions.base import Precision, ScalerFactory, scaled_step, wrap_forward

__all__ = ["AutocastPrecision"]

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class AutocastPrecision(Precision):
    """Forward under ``torch.autocast(dtype)``; fp16 scales the loss and skips overflowing steps."""

    modes: ClassVar[tuple[str, ...]] = ("fp16", "bf16")

    def __init__(
        self,
        mode: str,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        scaler_factory: ScalerFactory | None = None,
        handlers: dict[str, Any] | None = None,
    ) -> None:
        if mode not in _DTYPES:
            raise ValueError(f"AutocastPrecision serves {sorted(_DTYPES)}, not mixed_precision={mode!r}")
        super().__init__(mode, device, autocast_kwargs, scaler_kwargs, scaler_factory, handlers)
        if mode == "fp16" and self.device_type == "mps":
            raise ValueError("mixed_precision='fp16' is not supported on MPS by torch.amp.GradScaler; use 'bf16'")
        self._dtype = _DTYPES[mode]
        kwargs = self.autocast_kwargs.to_kwargs() if self.autocast_kwargs is not None else {}
        self._autocast_enabled = kwargs.pop("enabled", True)
        self._autocast_extra = kwargs
        if mode == "fp16":
            factory = scaler_factory or torch.amp.GradScaler
            self._scaler = factory(self.device_type, **(scaler_kwargs or GradScalerKwargs()).to_kwargs())

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def mixed_precision_dtypes(self) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype | None]:
        return (self._dtype, self._dtype, self._dtype)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(
            device_type=self.device_type, dtype=self._dtype, enabled=self._autocast_enabled, **self._autocast_extra
        )

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Run the model's forward under autocast, returning fp32 outputs."""
        wrap_forward(model, self._autocast)
        return model

    def forward_context(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        if handler is None:
            return self._autocast()
        kwargs = handler.to_kwargs()
        enabled = kwargs.pop("enabled", True)
        return torch.autocast(device_type=self.device_type, dtype=self._dtype, enabled=enabled, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> tuple[Any, bool]:
        if self._scaler is None:
            return super().optimizer_step(optimizer, closure)
        return scaled_step(self._scaler, optimizer, closure)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)

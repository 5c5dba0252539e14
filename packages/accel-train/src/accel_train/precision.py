"""Mixed precision: which autocast to enter, the gradient scaler, and wrapping a model's forward.

One :class:`Precision` object per Accelerator; it knows the mode (``no``, ``fp16``, ``bf16``, ``fp8``)
and the device type, and builds the pieces the training loop needs.
"""

from __future__ import annotations

import contextlib
import functools
from types import MethodType
from typing import Any

import torch

from accel_state.nested import convert_outputs_to_fp32
from accel_train.kwargs_handlers import AutocastKwargs, GradScalerKwargs

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    """Autocast and gradient scaling for one mixed-precision mode on one device type."""

    def __init__(
        self,
        mode: str,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        scaler_allowed: bool = True,
    ) -> None:
        self.mode = mode
        self.device_type = device.type
        self.autocast_kwargs = autocast_kwargs or AutocastKwargs()
        if mode == "fp8":
            raise NotImplementedError(
                "mixed_precision='fp8' needs FP8 kernels (TransformerEngine, MS-AMP or torchao), which accel "
                "provides through accel-quant; FP8 training is not available yet in accel. Use 'bf16' or 'fp16'."
            )
        if mode == "fp16" and self.device_type == "mps":
            raise ValueError("mixed_precision='fp16' is not supported on MPS by torch.amp.GradScaler; use 'bf16'")
        self.dtype = _DTYPES.get(mode)
        self.scaler: Any = None
        if mode == "fp16" and scaler_allowed:
            kwargs = (scaler_kwargs or GradScalerKwargs()).to_kwargs()
            self.scaler = torch.amp.GradScaler(self.device_type, **kwargs)

    @property
    def native_amp(self) -> bool:
        """True when the forward pass runs under ``torch.autocast``."""
        return self.dtype is not None

    def autocast(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` for this mode (a null context when precision is ``no``)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        handler = handler or self.autocast_kwargs
        kwargs = handler.to_kwargs()
        enabled = kwargs.pop("enabled", True)
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, enabled=enabled, **kwargs)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run ``model.forward`` under autocast and return fp32 outputs (undone by :func:`unwrap_forward`)."""
        if self.dtype is None or hasattr(model, "_accel_original_forward"):
            return
        original = model.forward
        dtype, device_type = self.dtype, self.device_type
        kwargs = self.autocast_kwargs.to_kwargs()
        enabled = kwargs.pop("enabled", True)

        def under_autocast(*args: Any, **kw: Any) -> Any:
            with torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled, **kwargs):
                return original(*args, **kw)

        functools.update_wrapper(under_autocast, original)
        wrapped = convert_outputs_to_fp32(under_autocast)
        model._accel_original_forward = original  # type: ignore[attr-defined, assignment]
        model.forward = wrapped  # type: ignore[method-assign, assignment]

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss


def unwrap_forward(model: torch.nn.Module) -> None:
    """Give back the forward a :meth:`Precision.wrap_forward` replaced."""
    original = model.__dict__.pop("_accel_original_forward", None)
    if original is None:
        return
    if isinstance(original, MethodType) and original.__self__ is model:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original  # type: ignore[method-assign, assignment]

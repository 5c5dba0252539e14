"""The precision base class: full precision (fp32), where every hook does the plain thing.

A precision owns the numeric side of a training step, so that strategies and the Accelerator never
look at the mode:

========================  ===================================================================
hook                      what it does
========================  ===================================================================
``convert_module``        change the model before it is wrapped (autocast forward, FP8 or
                          low-bit layers); ``restore_module`` undoes what can be undone
``forward_context``       the context of a forward pass (``torch.autocast`` ...)
``backward``              scale the loss and run backward
``optimizer_step``        step the optimizer (through the scaler); reports a skipped step
``unscale_``              divide scaled gradients by the scale before clipping
``state_dict``            the precision's own state (the scaler's), saved with checkpoints
``mixed_precision_dtypes``  parameter / reduce / buffer dtypes for a sharded strategy's policy
========================  ===================================================================

The gradient scaler never leaves the precision: `scaler` is read-only for the Accelerator's
documented ``accelerator.scaler`` attribute.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from accel_state.nested import convert_outputs_to_fp32

if TYPE_CHECKING:
    from accel_train.kwargs_handlers import AutocastKwargs, GradScalerKwargs

__all__ = ["Precision", "remove_forward_wrapper", "scaled_step", "wrap_forward"]

#: A factory of gradient scalers: ``factory(device_type, **GradScalerKwargs)``.
ScalerFactory = Callable[..., Any]


class Precision:
    """Full precision: no autocast, no scaler, optimizer steps as they are."""

    #: The ``mixed_precision`` values this class serves.
    modes: ClassVar[tuple[str, ...]] = ("no",)
    #: Strategy names a precision registered from outside can run with (``None``: every strategy that
    #: lists the mode in its ``Strategy.precisions``, the built-in compatibility table).
    supported_strategies: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        mode: str,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        scaler_factory: ScalerFactory | None = None,
        handlers: dict[str, Any] | None = None,
    ) -> None:
        self.mode = mode
        self.device = device
        self.device_type = device.type
        self.autocast_kwargs = autocast_kwargs
        self.scaler_kwargs = scaler_kwargs
        self.handlers = handlers or {}
        self._scaler: Any = None

    # -- what the rest of the library reads ---------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype | None:
        """The low-precision compute dtype (``None`` in full precision)."""
        return None

    @property
    def native_amp(self) -> bool:
        """True when the forward pass runs under ``torch.autocast``."""
        return self.dtype is not None

    @property
    def scaler(self) -> Any:
        """The gradient scaler (fp16 only), read-only."""
        return self._scaler

    @property
    def fp8_backend(self) -> str | None:
        """The FP8 backend in use (``TE``, ``MSAMP``, ``AO``), ``None`` without FP8."""
        return None

    def mixed_precision_dtypes(self) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype | None]:
        """``(param_dtype, reduce_dtype, buffer_dtype)`` for a sharded strategy's mixed-precision policy."""
        return (None, None, None)

    # -- model ----------------------------------------------------------------------------------------

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as this precision trains it (the same module in full precision)."""
        return model

    def restore_module(self, model: torch.nn.Module) -> None:
        """Undo the reversible parts of `convert_module()` (the autocast forward)."""
        remove_forward_wrapper(model)

    def forward_context(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Context for a forward pass (nothing in full precision)."""
        return contextlib.nullcontext()

    # -- step -----------------------------------------------------------------------------------------

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss as backward sees it (scaled by the gradient scaler in fp16)."""
        return self._scaler.scale(loss) if self._scaler is not None else loss

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Run backward on the (scaled) loss."""
        self.scale_loss(loss).backward(**kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> tuple[Any, bool]:
        """Step ``optimizer``; returns ``(its result, whether the update was skipped)``."""
        result = optimizer.step(closure) if closure is not None else optimizer.step()
        return result, False

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide scaled gradients by the scale (nothing without a scaler)."""

    # -- checkpoint -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any] | None:
        """The precision's own state for checkpoints (``None``: nothing to save)."""
        return self._scaler.state_dict() if self._scaler is not None else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._scaler is not None:
            self._scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode!r}, device_type={self.device_type!r})"


def wrap_forward(model: torch.nn.Module, context: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
    """Run ``model.forward`` inside ``context()`` and return fp32 outputs (undone by
    `remove_forward_wrapper()`). A model already wrapped is left as is."""
    if hasattr(model, "_accel_original_forward"):
        return
    original = model.forward

    def under_context(*args: Any, **kwargs: Any) -> Any:
        with context():
            return original(*args, **kwargs)

    functools.update_wrapper(under_context, original)
    wrapped = convert_outputs_to_fp32(under_context)
    model._accel_original_forward = original  # type: ignore[attr-defined, assignment]
    model.forward = wrapped  # type: ignore[method-assign, assignment]


def remove_forward_wrapper(model: torch.nn.Module) -> None:
    """Give back the forward that `wrap_forward()` replaced."""
    original = model.__dict__.pop("_accel_original_forward", None)
    if original is None:
        return
    if isinstance(original, MethodType) and original.__self__ is model:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original  # type: ignore[method-assign, assignment]


_MISSING = object()


def scaled_step(scaler: Any, optimizer: torch.optim.Optimizer, closure: Any = None) -> tuple[Any, bool]:
    """Step ``optimizer`` through a gradient scaler and update the scale.

    Returns ``(result, skipped)``: the scaler skips ``optimizer.step`` when gradients hold inf/NaN,
    which a flag on the way through tells.
    """
    called = False
    inner_step = optimizer.step

    def flagged_step(*args: Any, **kwargs: Any) -> Any:
        nonlocal called
        called = True
        return inner_step(*args, **kwargs)

    previous = optimizer.__dict__.get("step", _MISSING)
    optimizer.step = flagged_step  # type: ignore[method-assign]
    try:
        result = scaler.step(optimizer, closure) if closure is not None else scaler.step(optimizer)
        scaler.update()
    finally:
        if previous is _MISSING:
            del optimizer.step
        else:
            optimizer.step = previous  # type: ignore[method-assign]
    return result, not called

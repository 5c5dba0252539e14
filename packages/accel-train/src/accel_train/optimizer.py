"""``AcceleratedOptimizer``: an optimizer that steps only when gradients are synced.

It skips the step (and ``zero_grad``) on gradient-accumulation steps, drives the fp16 gradient
scaler, and records whether the scaler skipped the update because gradients overflowed.
"""

from __future__ import annotations

from typing import Any

import torch

from accel_state.nested import send_to_device
from accel_state.state import GradientState

__all__ = ["AcceleratedOptimizer", "unwrap_optimizer"]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer``; behaves like it, stepping only on sync steps.

    Args:
        optimizer: the optimizer to wrap.
        device_placement: move the optimizer's state to the device of the run.
        scaler: the ``torch.amp.GradScaler`` of fp16 training, if any (without ``precision``).
        precision: the Accelerator's precision, which steps the optimizer (and owns the scaler).
    """

    #: The `accel verify` recorder following this optimizer's steps (``None``, the class default, outside
    #: `accel verify`: then ``step`` pays one attribute test).
    _verify_hook: Any = None

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any = None,
        precision: Any = None,
    ) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.scaler = scaler if precision is None else precision.scaler
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        if device_placement and optimizer.state:
            from accel_state.state import AcceleratorState

            device = AcceleratorState().device
            state_dict = optimizer.state_dict()
            optimizer.load_state_dict(send_to_device(state_dict, device))

    # The optimizer's own attributes, seen through the wrapper.
    @property
    def state(self) -> Any:  # type: ignore[override]
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: Any) -> None:
        self.optimizer.param_groups = param_groups

    @property
    def defaults(self) -> Any:  # type: ignore[override]
        """The wrapped optimizer's default hyperparameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: Any) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer.

        Args:
            param_group: the group to add: its ``params`` and any hyperparameters that override the defaults.
        """
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state into the wrapped optimizer.

        Args:
            state_dict: a state as returned by ``state_dict``.
        """
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict[str, Any]:
        """Return the wrapped optimizer's state.

        Returns:
            The state dictionary of the wrapped optimizer.
        """
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, except on accumulation steps (where they must be kept).

        Args:
            set_to_none: set the gradients to ``None`` instead of zeroing them (default `True`).
        """
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)
        if self._verify_hook is not None:  # `accel verify --resume-at` saves here, at the end of a step
            self._verify_hook.on_zero_grad()

    def train(self) -> None:
        """Switch schedule-free optimizers to training mode (no-op for others)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Switch schedule-free optimizers to evaluation mode (no-op for others)."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Update the parameters on sync steps; with a scaler, skip the update on overflow.

        Args:
            closure: a callable that re-evaluates the model and returns the loss (default `None`).

        Returns:
            What the wrapped optimizer's ``step`` returned, or ``None`` on an accumulation step.
        """
        if not self.gradient_state.sync_gradients:
            return None
        hook = self._verify_hook
        if hook is None:
            return self._step(closure)
        hook.before_step(self)
        result = self._step(closure)
        hook.after_step(self)
        return result

    def _step(self, closure: Any) -> Any:
        """The real update, through the precision (or the scaler) when there is one."""
        if self.precision is not None:
            result, self._is_overflow = self.precision.optimizer_step(self.optimizer, closure)
            return result
        if self.scaler is None:
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        from accel_train.precisions.base import scaled_step

        result, self._is_overflow = scaled_step(self.scaler, self.optimizer, closure)
        return result

    @property
    def step_was_skipped(self) -> bool:
        """True when the last ``step`` was skipped because of inf/NaN gradients (fp16)."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in ("gradient_state", "_verify_hook")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer inside any number of `AcceleratedOptimizer` wrappers (``optimizer`` itself if none).

    Args:
        optimizer: a prepared optimizer, or a plain ``torch.optim.Optimizer``.
    """
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer

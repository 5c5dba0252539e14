"""``AcceleratedScheduler``: a learning-rate scheduler that follows the optimizer's real steps."""

from __future__ import annotations

from typing import Any

from accel_state.state import AcceleratorState, GradientState

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps ``scheduler`` so that it steps only when its optimizers really stepped.

    With ``step_with_optimizer`` (the default) the scheduler is stepped ``num_processes`` times per
    optimizer step when batches are not split, since each process saw its own batch; on accumulation
    steps it does not step (with ``adjust_scheduler``, only its step count advances); when an fp16
    step was skipped on overflow it does not step either.

    Args:
        scheduler: the learning-rate scheduler to wrap.
        optimizers: the optimizer (or list of optimizers) the scheduler follows.
        step_with_optimizer: step the scheduler only when the optimizers step (default `True`).
        split_batches: whether batches are split across processes, in which case the scheduler is
            stepped once per optimizer step rather than ``num_processes`` times (default `False`).
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler if its optimizers really stepped.

        Args:
            *args: positional arguments passed on to the wrapped scheduler's ``step``.
            **kwargs: keyword arguments passed on to the wrapped scheduler's ``step``.
        """
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        for optimizer in self.optimizers:
            if getattr(optimizer, "step_was_skipped", False):
                return
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(AcceleratorState().num_processes):
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> Any:
        """Return the last learning rates computed by the wrapped scheduler.

        Returns:
            The learning rate of each parameter group.
        """
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """Return the wrapped scheduler's state.

        Returns:
            The state dictionary of the wrapped scheduler.
        """
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state into the wrapped scheduler.

        Args:
            state_dict: a state as returned by ``state_dict``.
        """
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        """Compute the learning rates with the wrapped scheduler.

        Returns:
            The learning rate of each parameter group.
        """
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """Print the current learning rate through the wrapped scheduler.

        Args:
            *args: positional arguments passed on to the wrapped scheduler's ``print_lr``.
            **kwargs: keyword arguments passed on to the wrapped scheduler's ``print_lr``.

        Returns:
            What the wrapped scheduler's ``print_lr`` returned.
        """
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "__setstate__", "__getstate__"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"


class StandInScheduler:
    """A scheduler that a backend builds itself (DeepSpeed's config, Megatron-LM) stands as this in the
    script until ``prepare`` replaces it with the real one; the stand-in holds no state and cannot step.

    Subclasses name what replaces them in `replaced_by`.

    Args:
        optimizer: the optimizer it schedules.
        total_num_steps: optimizer steps of the whole run.
        warmup_num_steps: steps of warm-up.
        **kwargs: other scheduler settings, kept in `kwargs`.
    """

    #: What ``prepare`` puts in the stand-in's place (named in the error of `step()`).
    replaced_by: str = "the scheduler the backend builds"

    def __init__(
        self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Not available: ``prepare`` replaces the stand-in with the real scheduler.

        Args:
            *args: Accepted for the scheduler signature; unused.
            **kwargs: Accepted for the scheduler signature; unused.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(
            f"{type(self).__name__} only stands for {self.replaced_by}; pass it to `accelerator.prepare` and use "
            "the scheduler it returns"
        )

    def state_dict(self) -> dict[str, Any]:
        """An empty dict: the stand-in holds no state."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to load: the real scheduler is built by ``prepare``.

        Args:
            state_dict: Ignored.
        """

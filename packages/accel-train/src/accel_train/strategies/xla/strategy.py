"""The XLA strategy: one process per TPU core (spawned by ``accel launch --tpu``), torch_xla's device.

What it asks of torch_xla (``torch_xla.core.xla_model`` as ``xm``, ``torch_xla.distributed.parallel_loader``):

- the device: the state's device (``xm.xla_device()``), where models are placed;
- gradients: averaged over the cores with ``xm.reduce_gradients`` once per optimizer step, or earlier
  by `clip_grad_norm_()` (then the step does not reduce them again:
  ``GradientState.is_xla_gradients_synced``); with accumulation, gradients stay local until the sync step;
- the step: ``optimizer.step()`` then nothing else: the graph is cut by ``MpDeviceLoader`` at each batch
  (``xm.mark_step``), and by `mark_step()` before state is read for a checkpoint;
- data: each prepared loader wrapped in ``MpDeviceLoader`` through the strategy's data-loader hook;
- saving: weights moved to the CPU after ``xm.mark_step()`` and written by the main process.

torch_xla does not install with this torch: without it ``prepare`` raises ``BackendNotAvailableError``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from accel_state.install_hints import install_hint
from accel_train.optimizer import AcceleratedOptimizer
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.strategies.base import Prepared, Strategy

__all__ = ["XLAOptimizer", "XLAStrategy", "torch_xla_available", "xla_model"]


def torch_xla_available() -> bool:
    """True when torch_xla can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def xla_model() -> Any:
    """``torch_xla.core.xla_model``.

    Raises:
        BackendNotAvailableError: torch_xla is not installed.
    """
    if not torch_xla_available():
        raise BackendNotAvailableError(
            "XLA / TPU training needs torch_xla, which is not installed here; on a TPU VM, with the torch_xla "
            f"release matching torch: {install_hint('accel-train', 'xla')}"
        )
    return importlib.import_module("torch_xla.core.xla_model")


def _inner(optimizer: Any) -> Any:
    return optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer


def _reduce(optimizer: Any) -> None:
    """Average the gradients over the cores once for this step (not again when clipping did it)."""
    from accel_state.state import GradientState

    state = GradientState()
    if not state.is_xla_gradients_synced:
        xla_model().reduce_gradients(_inner(optimizer))
    state.is_xla_gradients_synced = False


class XLAOptimizer(AcceleratedOptimizer):
    """The prepared optimizer under XLA: gradients averaged over the cores before the update (sync steps)."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if self.gradient_state.sync_gradients:
            _reduce(self.optimizer)
        return super().step(closure)


class XLAStrategy(Strategy):
    """Data parallelism over TPU cores with torch_xla."""

    name = "xla"

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Prepared:
        if models or optimizers:
            xla_model()  # the named error without torch_xla
        return super().setup(models, optimizers, schedulers, device_placement, evaluation_mode, data_loaders)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool) -> Any:
        return XLAOptimizer(optimizer, device_placement=device_placement, precision=self.precision)

    def setup_data_loader(self, data_loader: Any, **options: Any) -> Any:
        """The sharded loader wrapped in ``MpDeviceLoader``: batches sent to the core ahead, a graph cut
        per batch.

        Args:
            data_loader: the user's ``torch.utils.data.DataLoader``.
            **options: the Accelerator's data-loader settings (see `Strategy.setup_data_loader()`).

        Returns:
            The device loader over the sharded loader.
        """
        sharded = super().setup_data_loader(data_loader, **options)
        xla_model()
        loader_module = importlib.import_module("torch_xla.distributed.parallel_loader")
        return loader_module.MpDeviceLoader(sharded, self.device)

    def mark_step(self) -> None:
        """Cut and run the pending graph (``xm.mark_step``)."""
        xla_model().mark_step()

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Gradients are reduced at the optimizer step only: nothing to switch off while accumulating."""
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """Reduce gradients over the cores first (the norm is the global one), then clip."""
        from accel_state.state import GradientState

        optimizers = list(optimizers)
        for optimizer in optimizers:
            _reduce(optimizer)
        GradientState().is_xla_gradients_synced = bool(optimizers)
        return super().clip_grad_norm_(parameters, max_norm, norm_type, optimizers)

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The weights on the CPU, after running the pending graph."""
        self.mark_step()
        return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in self.model_state_dict(model).items()}

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        self.mark_step()
        return _to_cpu(optimizer.state_dict())


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value

"""The XLA strategy: torch_xla's device, one process per replica (TPU core, or the CPU under ``PJRT_DEVICE=CPU``).

What it asks of torch_xla (``torch_xla.core.xla_model`` as ``xm``):

- the device: the state's device (``torch_xla.device()``), where models are placed. Moving a module to
  an XLA device gives it new parameter objects, so the optimizers of the same ``prepare`` call are
  pointed at them (`setup()`);
- gradients: averaged over the replicas with ``xm.reduce_gradients`` once per optimizer step, or earlier
  by `clip_grad_norm_()` (then the step does not reduce them again:
  ``GradientState.is_xla_gradients_synced``); with accumulation, gradients stay local until the sync step;
  with one replica the reduction changes nothing;
- the graph cut (``torch_xla.sync``, formerly ``xm.mark_step``): after each optimizer step, before each
  batch (`XLADeviceLoader`), and before any state is read for a checkpoint;
- data: each prepared loader wrapped in `XLADeviceLoader` through the strategy's data-loader hook;
- saving: weights and optimizer state moved to the CPU after the graph cut, written by the checkpoint
  package like every other backend's.

Without torch_xla, ``prepare`` raises ``BackendNotAvailableError``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from accel_state.install_hints import install_hint
from accel_train.optimizer import AcceleratedOptimizer
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.strategies.base import Prepared, Strategy, parameter_locations
from accel_train.strategies.xla.device_loader import XLADeviceLoader

__all__ = [
    "bf16_environment",
    "XLADeviceLoader",
    "XLAOptimizer",
    "XLAStrategy",
    "sync",
    "torch_xla_available",
    "xla_model",
]


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


def sync() -> None:
    """Cut and run the pending graph: ``torch_xla.sync()`` (``xm.mark_step()`` on releases without it)."""
    xla_model()
    torch_xla = importlib.import_module("torch_xla")
    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:
        xla_model().mark_step()


def bf16_environment(downcast: bool) -> dict[str, str]:
    """torch_xla's variables for bf16 on a TPU: all floats in bfloat16, or (``downcast``) float in bfloat16
    and double in float32."""
    if downcast:
        return {"XLA_USE_BF16": "0", "XLA_DOWNCAST_BF16": "1"}
    return {"XLA_USE_BF16": "1", "XLA_DOWNCAST_BF16": "0"}


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
        if not self.gradient_state.sync_gradients:
            return super().step(closure)
        _reduce(self.optimizer)
        result = super().step(closure)
        sync()  # the step's graph runs here: parameters are concrete before anything reads them
        return result


class XLAStrategy(Strategy):
    """Data parallelism over TPU cores with torch_xla."""

    name = "xla"

    @classmethod
    def apply_settings(cls, state: Any, requested_mode: str, precision: Any) -> None:
        """On a TPU, ``mixed_precision="bf16"`` also sets torch_xla's bf16 variables, as documented:
        ``XLA_USE_BF16=1`` (float and double tensors in bfloat16), or with ``ACCELERATE_DOWNCAST_BF16``
        (``accel launch --downcast_bf16``) ``XLA_DOWNCAST_BF16=1`` (float in bfloat16, double in float32).
        Elsewhere (torch_xla's CPU or GPU device) bf16 is autocast only and nothing is set."""
        from accel_state import env_vars, imports

        if requested_mode != "bf16" or not imports.is_torch_xla_available(check_is_tpu=True):
            return
        os.environ.update(bf16_environment(bool(env_vars.read("ACCELERATE_DOWNCAST_BF16"))))

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
        locations = parameter_locations(models)
        prepared = super().setup(models, optimizers, schedulers, device_placement, evaluation_mode, data_loaders)
        new_params = [dict(self.unwrap_model(m, keep_torch_compile=False).named_parameters()) for m in prepared.models]
        for optimizer in prepared.optimizers:
            _follow_moved_parameters(_inner(optimizer), locations, new_params)
        return prepared

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool) -> Any:
        return XLAOptimizer(optimizer, device_placement=device_placement, precision=self.precision)

    def setup_data_loader(self, data_loader: Any, **options: Any) -> Any:
        """The sharded loader wrapped in `XLADeviceLoader`: each batch sent to the device, a graph cut
        before each.

        Args:
            data_loader: the user's ``torch.utils.data.DataLoader``.
            **options: the Accelerator's data-loader settings (see `Strategy.setup_data_loader()`).

        Returns:
            The device loader over the sharded loader (its ``base_dataloader``).
        """
        xla_model()
        sharded = super().setup_data_loader(data_loader, **options)
        return XLADeviceLoader(sharded, self.device, sync, put_on_device=bool(options.get("put_on_device", True)))

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        """Skip in the sharded loader, then wrap the result for the device like the loader it came from."""
        if not isinstance(dataloader, XLADeviceLoader):
            return super().skip_first_batches(dataloader, num_batches)
        skipped = super().skip_first_batches(dataloader.base_dataloader, num_batches)
        return XLADeviceLoader(skipped, dataloader.device, sync, put_on_device=dataloader._put_on_device)

    def mark_step(self) -> None:
        """Cut and run the pending graph (`sync()`)."""
        sync()

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

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The weights on the CPU, after running the pending graph: what ``get_state_dict``, ``save_model``
        and ``save_state`` hand on (the writers and the tied-weight checks need tensors with storage)."""
        self.mark_step()
        return _to_cpu(super().model_state_dict(model, unwrap))

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The weights on the CPU, after running the pending graph (`model_state_dict()`)."""
        return self.model_state_dict(model)

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        self.mark_step()
        return _to_cpu(optimizer.state_dict())

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        """Read the weights on the CPU (torch's readers cannot place tensors on an XLA device) and copy
        them into the model on its device."""
        super().load_model_checkpoint(model, folder, entry, "cpu", strict)

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        """Read the optimizer state on the CPU; ``load_state_dict`` moves it to its parameters' device."""
        super().load_optimizer_checkpoint(optimizer, folder, index, "cpu")


def _follow_moved_parameters(
    optimizer: torch.optim.Optimizer, locations: dict[int, tuple[int, str]], new_params: Sequence[dict[str, Any]]
) -> None:
    """Point ``optimizer`` at the parameters its models have on the XLA device, in place.

    ``module.to(xla)`` replaces each parameter by a new object; an optimizer built before ``prepare``
    would otherwise update the CPU tensors the model no longer uses. Parameters of models not in this
    ``prepare`` call are left as they are; state loaded before ``prepare`` follows its parameter.
    """
    for group in optimizer.param_groups:
        rebound = []
        for param in group["params"]:
            where = locations.get(id(param))
            new = new_params[where[0]].get(where[1]) if where is not None else None
            if new is None or new is param:
                rebound.append(param)
                continue
            if param in optimizer.state:
                optimizer.state[new] = optimizer.state.pop(param)
            rebound.append(new)
        group["params"] = rebound


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value

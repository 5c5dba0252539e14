"""The ``Accelerator``: one object that adapts a PyTorch training loop to the launch configuration.

It is a facade: mixed precision lives in :mod:`accel_train.precision`, model wrapping in
:mod:`accel_train.strategy`, checkpoints in :mod:`accel_train.checkpointing` (through
:class:`~accel_train._state_io.StateIOMixin`), collectives in :class:`~accel_train._process_ops.ProcessOpsMixin`
and trackers in :class:`~accel_train._trackers.TrackersMixin`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from accel_state import env_vars
from accel_state.enums import PrecisionType, RNGType
from accel_state.kwargs import InitProcessGroupKwargs, KwargsHandler
from accel_state.state import AcceleratorState, GradientState
from accel_train import strategy
from accel_train._attributes import AttributesMixin
from accel_train._process_ops import ProcessOpsMixin
from accel_train._state_io import StateIOMixin
from accel_train._trackers import TrackersMixin
from accel_train.kwargs_handlers import (
    AORecipeKwargs,
    AutocastKwargs,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    TERecipeKwargs,
)
from accel_train.optimizer import AcceleratedOptimizer
from accel_train.parallel_plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    not_available,
)
from accel_train.plugins import GradientAccumulationPlugin, ProjectConfiguration, TorchDynamoPlugin
from accel_train.precision import Precision
from accel_train.scheduler import AcceleratedScheduler

__all__ = ["Accelerator"]

_UNSET: Any = object()
_HANDLER_SLOTS = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
    AORecipeKwargs: "ao_recipe_handler",
}


class _DataAPI:
    """Names of accel-data, looked up on its package (lazy exports) or its modules."""

    _MODULES = ("accel_data", "accel_data.data_loader", "accel_data.config", "accel_data.skip", "accel_data.loaders")

    def __getattr__(self, name: str) -> Any:
        import importlib

        for module_name in self._MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            try:
                return getattr(module, name)
            except AttributeError:
                continue
        raise AttributeError(f"accel-data does not provide {name!r} (needed by the Accelerator); install accel-data")


def _data_module() -> Any:
    return _DataAPI()


def _prepared_loader_types(data: Any) -> tuple[type, ...]:
    types = []
    for name in ("DataLoaderShard", "DataLoaderDispatcher"):
        try:
            types.append(getattr(data, name))
        except AttributeError:
            continue
    return tuple(t for t in types if isinstance(t, type))


class Accelerator(AttributesMixin, ProcessOpsMixin, StateIOMixin, TrackersMixin):
    """Adapts models, optimizers, data loaders and schedulers to the run's devices and processes.

    Every argument is optional; the launch configuration (``accel launch`` or the environment)
    supplies the rest. See the reference of each argument in the documentation.
    """

    ddp_handler: DistributedDataParallelKwargs | None
    scaler_handler: GradScalerKwargs | None
    init_handler: InitProcessGroupKwargs | None
    autocast_handler: AutocastKwargs | None
    profile_handler: ProfileKwargs | None
    fp8_recipe_handler: FP8RecipeKwargs | None
    te_recipe_handler: TERecipeKwargs | None
    msamp_recipe_handler: MSAMPRecipeKwargs | None
    ao_recipe_handler: AORecipeKwargs | None

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: PrecisionType | str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        rng_types: list[str | RNGType] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
    ) -> None:
        # Project folders.
        if project_config is not None and not isinstance(project_config, ProjectConfiguration):
            raise TypeError(f"project_config must be a ProjectConfiguration, got {type(project_config).__name__}")
        self.project_configuration = project_config or ProjectConfiguration(
            project_dir=None if project_dir is None else os.fspath(project_dir)
        )
        if project_dir is not None:
            self.project_configuration.set_directories(project_dir)

        if mixed_precision is not None:
            mixed_precision = PrecisionType.parse(mixed_precision).value  # clear error on a wrong value

        # Kwargs handlers: one of each kind.
        for name in _HANDLER_SLOTS.values():
            setattr(self, name, None)
        for handler in kwargs_handlers or []:
            if not isinstance(handler, KwargsHandler):
                raise TypeError(f"kwargs_handlers takes KwargsHandler objects, got {type(handler).__name__}")
            slot: str | None = next((s for cls, s in _HANDLER_SLOTS.items() if type(handler) is cls), None)
            if slot is None:
                slot = next((s for cls, s in _HANDLER_SLOTS.items() if isinstance(handler, cls)), None)
            if slot is None:
                raise ValueError(f"unsupported kwargs handler {type(handler).__name__}")
            if getattr(self, slot) is not None:
                raise ValueError(f"you can only pass one {type(handler).__name__} in `kwargs_handlers`")
            setattr(self, slot, handler)

        # Parallelism plugins (validated now, refused at prepare time).
        if deepspeed_plugins is not None and deepspeed_plugin is not None:
            raise ValueError("give only one of `deepspeed_plugin` and `deepspeed_plugins` (they are aliases)")
        deepspeed_plugin = deepspeed_plugin if deepspeed_plugin is not None else deepspeed_plugins
        if deepspeed_plugin is None and env_vars.read("ACCELERATE_USE_DEEPSPEED"):
            deepspeed_plugin = DeepSpeedPlugin()
        if fsdp_plugin is None and env_vars.read("ACCELERATE_USE_FSDP"):
            fsdp_plugin = FullyShardedDataParallelPlugin()
        if megatron_lm_plugin is None and env_vars.read("ACCELERATE_USE_MEGATRON_LM"):
            megatron_lm_plugin = MegatronLMPlugin()
        for value, cls, name in (
            (fsdp_plugin, FullyShardedDataParallelPlugin, "fsdp_plugin"),
            (megatron_lm_plugin, MegatronLMPlugin, "megatron_lm_plugin"),
        ):
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
        if sum(p is not None for p in (deepspeed_plugin, fsdp_plugin, megatron_lm_plugin)) > 1:
            raise ValueError("use only one of DeepSpeed, FSDP and Megatron-LM in one Accelerator")

        # torch.compile.
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError("give either `dynamo_backend` or `dynamo_plugin`, not both")
        if dynamo_plugin is None:
            dynamo_plugin = TorchDynamoPlugin(backend=dynamo_backend)
        elif not isinstance(dynamo_plugin, TorchDynamoPlugin):
            raise TypeError(f"dynamo_plugin must be a TorchDynamoPlugin, got {type(dynamo_plugin).__name__}")

        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        self.state = AcceleratorState(
            mixed_precision=mixed_precision,
            cpu=cpu,
            dynamo_plugin=dynamo_plugin,
            deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin,
            torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config,
            _from_accelerator=True,
            **init_kwargs,
        )

        # Gradient accumulation.
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError(
                    "give the number of accumulation steps either as `gradient_accumulation_steps` or in the "
                    "`gradient_accumulation_plugin`, not both"
                )
            if not isinstance(gradient_accumulation_plugin, GradientAccumulationPlugin):
                raise TypeError("gradient_accumulation_plugin must be a GradientAccumulationPlugin")
        else:
            steps = gradient_accumulation_steps
            if steps == 1:
                steps = int(env_vars.read("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"))
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin=gradient_accumulation_plugin)

        # Data loaders.
        if dataloader_config is None:
            dataloader_config = _data_module().DataLoaderConfiguration()
        if split_batches is not _UNSET:
            dataloader_config.split_batches = split_batches
        self.dataloader_config = dataloader_config

        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = rng_types if rng_types is not None else ["generator"]
        self.precision = Precision(
            self.state.mixed_precision,
            self.state.device,
            autocast_kwargs=self.autocast_handler,
            scaler_kwargs=self.scaler_handler,
        )
        self.scaler = self.precision.scaler
        self.native_amp = self.precision.native_amp

        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[Any] = []
        self._optimizers: list[Any] = []
        self._schedulers: list[Any] = []
        self._dataloaders: list[Any] = []
        self._custom_objects: list[Any] = []
        self._save_model_state_pre_hook: dict[int, Any] = {}
        self._load_model_state_pre_hook: dict[int, Any] = {}
        self.trackers: list[Any] = []
        self.log_with = self._filter_trackers(log_with)

    # -- prepare ----------------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers (any order and number).

        Returns them in the same order (a single object when one was given).
        """
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"device_placement has {len(device_placement)} entries but {len(args)} objects were passed to prepare"
            )
        strategy.check_supported(self.distributed_type)
        if self.parallelism_config is not None and not getattr(self.parallelism_config, "is_trivial", True):
            raise not_available("Tensor / context / sharded data parallelism (parallelism_config)")
        first = [self._prepare_first(obj, placement) for obj, placement in zip(args, device_placement)]
        result = tuple(self._prepare_second(obj) for obj in first)
        return result[0] if len(result) == 1 else result

    def _prepare_first(self, obj: Any, placement: bool | None) -> Any:
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=placement)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=placement)
        return obj

    def _prepare_second(self, obj: Any) -> Any:
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
            hasattr(obj, "step")
            and hasattr(obj, "optimizer")
            and hasattr(obj, "state_dict")
            and not isinstance(obj, (AcceleratedScheduler, torch.optim.Optimizer))
        ):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place the model, wrap it for DDP (not in ``evaluation_mode``), mixed precision and compile."""
        strategy.check_supported(self.distributed_type)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"prepare_model takes a torch.nn.Module, got {type(model).__name__}")
        if device_placement is None:
            device_placement = self.device_placement
        self._models.append(model)
        device_map = getattr(model, "hf_device_map", None)
        if device_map is not None and self.verify_device_map(model) and self.use_distributed:
            raise ValueError(
                "a model loaded with a device map spread over several devices (device_map='auto') cannot be "
                "trained in a distributed run; load it on one device per process"
            )
        if device_placement and device_map is None:
            model = model.to(self.device)
        self.precision.wrap_forward(strategy.unwrap(model))
        distributed = strategy.uses_ddp(self.distributed_type) and self.num_processes > 1
        if not evaluation_mode and distributed and strategy.has_trainable_parameters(model):
            model = strategy.wrap_ddp(model, self.device, self.ddp_handler)
        plugin = self.state.dynamo_plugin
        if plugin is not None and plugin.enabled:
            model = strategy.compile_model(model, plugin)
        self._models[-1] = model
        return model

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap the optimizer so it steps only on sync steps and drives the gradient scaler."""
        strategy.check_supported(self.distributed_type)
        if isinstance(optimizer, AcceleratedOptimizer):
            if optimizer not in self._optimizers:
                self._optimizers.append(optimizer)
            return optimizer
        if device_placement is None:
            device_placement = self.device_placement
        wrapped = AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.scaler)
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap the scheduler so it follows the optimizer's real steps."""
        if isinstance(scheduler, AcceleratedScheduler):
            if scheduler not in self._schedulers:
                self._schedulers.append(scheduler)
            return scheduler
        optimizer: Any = self._optimizers
        for candidate in self._optimizers:
            if getattr(scheduler, "optimizer", None) is candidate.optimizer:
                optimizer = candidate
                break
        wrapped = AcceleratedScheduler(
            scheduler,
            optimizer,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_data_loader(
        self, data_loader: Any, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        """Shard the data loader over processes and move its batches to the device."""
        data = _data_module()
        if getattr(data_loader, "_is_accelerate_prepared", False) or any(
            isinstance(data_loader, cls) for cls in _prepared_loader_types(data)
        ):
            if data_loader not in self._dataloaders:
                self._dataloaders.append(data_loader)
            return data_loader
        if device_placement is None:
            device_placement = self.device_placement
        config = self.dataloader_config
        prepared = data.prepare_data_loader(
            data_loader,
            self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            put_on_device=device_placement,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=getattr(config, "data_seed", None),
            non_blocking=config.non_blocking,
            use_stateful_dataloader=self.use_stateful_dataloader,
        )
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts after the first ``num_batches`` batches (to resume mid-epoch)."""
        return _data_module().skip_first_batches(dataloader, num_batches=num_batches)

    # -- backward, accumulation, synchronisation --------------------------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled in fp16."""
        steps = self.gradient_state.plugin_kwargs["num_steps"]
        if steps != 1:
            loss = loss / steps
        scaler = self.scaler
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def _do_sync(self) -> None:
        gradient_state = self.gradient_state
        if gradient_state.sync_with_dataloader and gradient_state.end_of_dataloader:
            self.step = 0
            gradient_state.sync_gradients = True
        else:
            self.step += 1
            gradient_state.sync_gradients = (self.step % gradient_state.plugin_kwargs["num_steps"]) == 0

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Accumulate gradients: no gradient sync except every ``num_steps`` batches and on the last batch."""
        self._do_sync()
        if self.gradient_state.sync_gradients or not self.state.use_distributed or self.gradient_state.sync_each_batch:
            yield
            return
        with contextlib.ExitStack() as stack:
            for model in models:
                stack.enter_context(strategy.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module | None = None) -> Iterator[None]:
        """Skip DDP's gradient all-reduce inside the block (no-op outside DDP)."""
        models = [model] if model is not None else list(self._models)
        if not self.state.use_distributed:
            yield
            return
        with contextlib.ExitStack() as stack:
            for each in models:
                stack.enter_context(strategy.no_sync(each))
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of ``model`` all-reduce gradients, even inside :meth:`no_sync`."""
        inner = model._orig_mod if strategy.is_compiled(model) else model
        if not self.state.use_distributed or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
            yield
            return
        old_backward, old_forward = inner.require_backward_grad_sync, inner.require_forward_param_sync
        inner.require_backward_grad_sync = True
        inner.require_forward_param_sync = True
        inner.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            inner.require_backward_grad_sync = old_backward
            inner.require_forward_param_sync = old_forward

    @contextlib.contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """Mixed-precision autocast for the block (nothing when precision is ``no``)."""
        with self.precision.autocast(autocast_handler):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16-scaled gradients by the scale (no-op without a gradient scaler)."""
        if self.scaler is None:
            return
        optimizers = self._optimizers if optimizer is None else optimizer
        if not isinstance(optimizers, (list, tuple)):
            optimizers = [optimizers]
        for opt in optimizers:
            while isinstance(opt, AcceleratedOptimizer):
                opt = opt.optimizer
            self.scaler.unscale_(opt)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` after unscaling fp16 gradients; returns the total norm."""
        parameters = list(parameters)
        self.unscale_gradients()
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """``torch.nn.utils.clip_grad_value_`` after unscaling fp16 gradients."""
        parameters = list(parameters)
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Fused backward and update of LOMO / AdaLomo optimizers (``pip install lomo-optim``)."""
        from accel_state.imports import is_lomo_available

        if not is_lomo_available():
            raise ImportError("lomo_backward needs the LOMO optimizers: pip install lomo-optim")
        from lomo_optim import AdaLomo, Lomo

        found = False
        for optimizer in self._optimizers:
            inner = optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer
            if isinstance(inner, (Lomo, AdaLomo)):
                inner.fused_backward(loss, learning_rate)
                found = True
        if not found:
            raise ValueError("lomo_backward needs a Lomo or AdaLomo optimizer passed to `prepare`")

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Train on uneven per-process inputs under DDP (``torch.distributed.algorithms.Join``)."""
        if not (self.use_distributed and strategy.uses_ddp(self.distributed_type)):
            yield
            return
        from torch.distributed.algorithms import Join

        saved: list[tuple[Any, bool]] = []
        if even_batches is not None:
            for loader in self._dataloaders:
                sampler = getattr(loader, "batch_sampler", None)
                if sampler is not None and hasattr(sampler, "even_batches"):
                    saved.append((sampler, sampler.even_batches))
                    sampler.even_batches = even_batches
        try:
            with Join(joinables):
                yield
        finally:
            for sampler, value in saved:
                sampler.even_batches = value

    # -- models -----------------------------------------------------------------------------------

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's model from inside the DDP / compile / mixed-precision wrappers."""
        return strategy.unwrap(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict (of the unwrapped model by default)."""
        if unwrap:
            model = self.unwrap_model(model, keep_torch_compile=False)
        return model.state_dict()

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when the model (or a submodule) was dispatched over several devices by a device map."""
        for module in model.modules():
            device_map = getattr(module, "hf_device_map", None)
            if device_map is not None and len(set(device_map.values())) > 1:
                return True
        return False

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references this Accelerator holds, collect garbage and reset :attr:`step`."""
        from accel_state.memory import release_memory

        self._schedulers = []
        self._optimizers = []
        self._models = []
        self._dataloaders = []
        self.step = 0
        return release_memory(*objects)

    clear = free_memory

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with ``torch.profiler``; writes ``profile_{rank}.json`` to ``output_trace_dir``."""
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is not None:
            from accel_state.constants import PROFILE_PATTERN_NAME

            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(
                os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=self.process_index))
            )
        self.wait_for_everyone()

    @contextlib.contextmanager
    def maybe_context_parallel(
        self, buffers: Any = None, buffer_seq_dims: Any = None, no_restore_buffers: Any = None
    ) -> Iterator[None]:
        """Context parallelism needs FSDP2 with ``cp_size > 1``; without it this does nothing."""
        yield

    def __repr__(self) -> str:
        return f"Accelerator(distributed_type={self.distributed_type}, num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r}, device={self.device})"

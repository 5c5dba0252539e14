"""The ``Accelerator``: one object that adapts a PyTorch training loop to the launch configuration.

It is a facade. `accel_train.connector` builds its three components from the arguments, the
plugins and the environment the launcher wrote: a **strategy** (how models are spread over
processes: `accel_train.strategies`), a **precision** (`accel_train.precisions`) and a
**checkpoint I/O**. Every method below delegates to them, without branching on the backend.
The Accelerator is a facade over named public components (``accel_train.components``), each of which
defines and documents its methods: checkpoints in `Checkpointer`,
collectives in `ProcessOperations`, trackers in
`Trackers` and the read-only attributes in
`AcceleratorAttributes`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from accel_data.config import DataLoaderConfiguration
from accel_state import env_vars
from accel_state.enums import PrecisionType, RNGType
from accel_state.install_hints import install_hint
from accel_state.kwargs import InitProcessGroupKwargs, KwargsHandler
from accel_state.state import GradientState
from accel_train import connector
from accel_train.components.attributes import AcceleratorAttributes
from accel_train.components.checkpointer import Checkpointer
from accel_train.components.process_ops import ProcessOperations
from accel_train.components.trackers import Trackers
from accel_train.optimizer import AcceleratedOptimizer
from accel_train.plugins import GradientAccumulationPlugin, ProjectConfiguration, TorchDynamoPlugin
from accel_train.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
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
    from accel_train.parallel_plugins import FullyShardedDataParallelPlugin, MegatronLMPlugin

__all__ = ["Accelerator", "DataLoaderConfiguration"]


class _FromDataLoaderConfig:
    """The default of ``Accelerator(split_batches=...)``: not given, so ``dataloader_config`` decides.

    A named object rather than ``None``, so that an explicit value of any kind still overrides the
    configuration; its name is what signatures, ``help()`` and the API reference show.
    """

    def __repr__(self) -> str:
        return "FROM_DATALOADER_CONFIG"


#: ``split_batches`` was not given: keep ``dataloader_config.split_batches`` (`False` by default).
FROM_DATALOADER_CONFIG: Any = _FromDataLoaderConfig()


def _prepared_loader_types() -> tuple[type, ...]:
    from accel_data import DataLoaderDispatcher, DataLoaderShard

    return (DataLoaderShard, DataLoaderDispatcher)


def _is_wrapper(obj: Any) -> bool:
    """An object that is already the prepared form of something (returned by ``prepare`` as is)."""
    return isinstance(obj, (AcceleratedOptimizer, AcceleratedScheduler)) or (
        isinstance(obj, torch.utils.data.DataLoader) and isinstance(obj, _prepared_loader_types())
    )


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step")
        and hasattr(obj, "optimizer")
        and hasattr(obj, "state_dict")
        and not isinstance(obj, (AcceleratedScheduler, torch.optim.Optimizer))
    )


class Accelerator(AcceleratorAttributes, ProcessOperations, Checkpointer, Trackers):
    """Adapts models, optimizers, data loaders and schedulers to the run's devices and processes.

    Every argument is optional; the launch configuration (``accel launch`` or the environment)
    supplies the rest. See the reference of each argument in the documentation.

    Args:
        device_placement: move prepared models and batches to the run's device (default `True`).
        split_batches: split each batch of the data loaders across processes instead of giving each
            process its own batch. The default, ``FROM_DATALOADER_CONFIG``, keeps the value of
            ``dataloader_config`` (`False` unless that says otherwise); `True` or `False` overrides it.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``; `None` takes the launch configuration.
        gradient_accumulation_steps: number of steps to accumulate gradients over before the
            optimizer steps (default `1`); used with `accumulate()`.
        cpu: run on the CPU even when an accelerator is available (default `False`).
        dataloader_config: a ``DataLoaderConfiguration`` for how data loaders are prepared (default `None`).
        deepspeed_plugin: a ``DeepSpeedPlugin`` (or dict of them) configuring DeepSpeed (default `None`).
        fsdp_plugin: a ``FullyShardedDataParallelPlugin`` configuring FSDP (default `None`).
        torch_tp_plugin: a ``TorchTensorParallelPlugin`` configuring tensor parallelism (default `None`).
        megatron_lm_plugin: a ``MegatronLMPlugin`` configuring Megatron-LM (default `None`).
        rng_types: the random number generators synchronized at the start of each epoch of the
            prepared data loaders (default `None`, meaning ``["generator"]``).
        log_with: the tracker(s) to log to: names, ``"all"`` or ``GeneralTracker`` instances (default `None`).
        project_dir: folder for checkpoints and logs (default `None`).
        project_config: a ``ProjectConfiguration`` for checkpoint naming and folders (default `None`).
        gradient_accumulation_plugin: a ``GradientAccumulationPlugin`` with the accumulation settings;
            replaces ``gradient_accumulation_steps`` (default `None`).
        step_scheduler_with_optimizer: step prepared schedulers only when the optimizer really steps
            (default `True`).
        kwargs_handlers: ``KwargsHandler`` objects customizing DDP, the gradient scaler, the process group,
            autocast, profiling or FP8 (default `None`).
        dynamo_backend: the ``torch.compile`` backend to compile prepared models with (default `None`).
        dynamo_plugin: a ``TorchDynamoPlugin`` with the ``torch.compile`` settings (default `None`).
        deepspeed_plugins: several named ``DeepSpeedPlugin`` objects, as a dict (default `None`).
        parallelism_config: a ``ParallelismConfig`` combining data, tensor and context parallelism
            (default `None`).

    Raises:
        TypeError: if ``project_config`` is not a ``ProjectConfiguration``.
    """

    #: The `accel verify` recorder (`accel_train.verify_recorder`); ``None`` outside `accel verify`.
    _verify: Any = None
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
        split_batches: bool = FROM_DATALOADER_CONFIG,
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

        components = connector.build(
            mixed_precision=mixed_precision,
            cpu=cpu,
            kwargs_handlers=kwargs_handlers,
            deepspeed_plugin=deepspeed_plugin,
            deepspeed_plugins=deepspeed_plugins,
            fsdp_plugin=fsdp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            torch_tp_plugin=torch_tp_plugin,
            parallelism_config=parallelism_config,
            dynamo_backend=dynamo_backend,
            dynamo_plugin=dynamo_plugin,
        )
        for slot, handler in components.handlers.items():
            setattr(self, slot, handler)
        self.state = components.state
        if self.state.is_local_main_process:
            from accel_state.environment import check_os_kernel

            check_os_kernel()  # old Linux kernels can hang multi-process runs: warn once
        self._strategy = components.strategy
        self.precision = components.precision
        self.checkpoint_io = components.checkpoint_io
        parallelism = self.state.parallelism_config
        if parallelism is not None and self._strategy.device_mesh is None and self.state.num_processes > 1:
            # Plain data parallelism still has the documented mesh (torch_device_mesh["dp"], ...): build it
            # now, on every process together (building it creates process groups).
            parallelism.get_device_mesh(self.state.device.type)

        # Gradient accumulation.
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError(
                    "You can only pass one of `GradientAccumulationPlugin` and `gradient_accumulation_steps`: give "
                    "the number of accumulation steps in the `gradient_accumulation_plugin` only."
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
            dataloader_config = DataLoaderConfiguration()
        if split_batches is not FROM_DATALOADER_CONFIG:
            dataloader_config.split_batches = split_batches
        self.dataloader_config = dataloader_config

        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = rng_types if rng_types is not None else ["generator"]

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
        self._preemption: Any = None
        self._rewind_active_loader = False
        if self.project_configuration.save_on_preemption:
            from accel_train.preemption import PreemptionWatch

            self._preemption = PreemptionWatch()
            self._preemption.install()
        # `accel verify` asks for a record of the first optimizer steps through the environment; without
        # it this stays None and backward / the optimizer's step test only that.
        if os.environ.get("ACCEL_VERIFY_RECORD"):
            from accel_train.verify_recorder import recorder_from_environment

            self._verify = recorder_from_environment(self)

    # -- prepare ----------------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers (any order and number).

        Data loaders are prepared first; then the strategy sets up the models, optimizers and
        schedulers of the call together. Returns them in the same order (a single object when one
        was given).

        Args:
            *args: the models, optimizers, data loaders and schedulers to prepare; other objects are
                returned unchanged.
            device_placement: per object, whether to move it to the device; `None` (the default) uses the
                Accelerator's ``device_placement``.

        Returns:
            The prepared objects, in the order given.

        Raises:
            ValueError: ``device_placement`` does not have one entry per object; a model dispatched over
                several devices in a distributed run; a model with weights on the ``meta`` device that no
                offload hook holds (`UnloadedWeightsError`, raised
                before anything is moved or registered).
        """
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"device_placement has {len(device_placement)} entries but {len(args)} objects were passed to prepare"
            )
        models = [i for i, obj in enumerate(args) if isinstance(obj, torch.nn.Module) and not _is_prepared(obj)]
        for i in models:  # every model is checked before any object is prepared
            self._check_device_map(args[i])
            self._check_weights_loaded(args[i])
        result = list(args)
        for index, obj in enumerate(args):
            if isinstance(obj, torch.utils.data.DataLoader):
                result[index] = self.prepare_data_loader(obj, device_placement=device_placement[index])
        optimizers = [
            i
            for i, obj in enumerate(args)
            if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer)
        ]
        schedulers = [i for i, obj in enumerate(args) if _is_scheduler(obj) and not _is_prepared(obj)]
        if models or optimizers or schedulers:
            placements = [self._placement(device_placement[i]) for i in models]
            prepared = self._strategy.setup(
                [args[i] for i in models],
                [args[i] for i in optimizers],
                [args[i] for i in schedulers],
                device_placement=placements,
                # only this call's loaders, as documented: not those of an earlier (maybe failed) call
                data_loaders=[result[i] for i, obj in enumerate(args) if isinstance(obj, torch.utils.data.DataLoader)],
            )
            for i, model in zip(models, prepared.models):
                result[i] = self._register_model(model)
            if prepared.models:  # sequence parallelism (DeepSpeed Ulysses) adapts the call's data loaders
                for i, obj in enumerate(args):
                    if isinstance(obj, torch.utils.data.DataLoader):
                        result[i] = self._strategy.ulysses_dl_adapter(result[i], prepared.models[0])
            for i, optimizer in zip(optimizers, prepared.optimizers):
                result[i] = self._register_optimizer(optimizer, self._placement(device_placement[i]))
            for i, scheduler in zip(schedulers, prepared.schedulers):
                result[i] = self._register_scheduler(scheduler)
        for index, obj in enumerate(args):  # objects prepared before: registered, returned as they are
            if result[index] is obj and (_is_prepared(obj) or _is_wrapper(obj)):
                self._remember(obj)
        self._verify_prepared()
        return result[0] if len(result) == 1 else tuple(result)

    def _verify_prepared(self) -> None:
        """Tell the `accel verify` recorder that objects were prepared (a resumed run loads its state once
        the script has prepared what the saving run had); nothing outside `accel verify`."""
        if self._verify is not None:
            self._verify.after_prepare()

    def _placement(self, value: bool | None) -> bool:
        return self.device_placement if value is None else bool(value)

    def _check_device_map(self, model: torch.nn.Module) -> None:
        if getattr(model, "hf_device_map", None) is not None and self.verify_device_map(model) and self.use_distributed:
            raise ValueError(
                "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode: "
                "its layers are spread over several devices. Load it on one device per process, or run one "
                "process (`--num_processes=1`)."
            )

    def _check_weights_loaded(self, model: torch.nn.Module, evaluation_mode: bool = False) -> None:
        """Refuse, before anything moves, a model with ``meta`` weights that no offload hook holds
        (built under ``init_empty_weights()`` and never loaded), unless the backend fills them itself."""
        from accel_train.weights.unloaded import UnloadedWeightsError, unloaded_weights

        names, total = unloaded_weights(model)
        if names and not self._strategy.materialises_meta_weights(evaluation_mode):
            raise UnloadedWeightsError(type(model).__name__, names, total)

    def _remember(self, obj: Any) -> None:
        if isinstance(obj, torch.optim.Optimizer):
            registry = self._optimizers
        elif isinstance(obj, torch.nn.Module):
            registry = self._models
        elif isinstance(obj, torch.utils.data.DataLoader) or hasattr(obj, "batch_sampler"):
            registry = self._dataloaders
        else:
            registry = self._schedulers
        if not any(item is obj for item in registry):
            registry.append(obj)

    def _register_model(self, model: torch.nn.Module) -> torch.nn.Module:
        _mark_prepared(model)
        self._models.append(model)
        return model

    def _register_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool) -> Any:
        wrapped = self._strategy.wrap_optimizer(optimizer, device_placement)
        _mark_prepared(wrapped)
        self._optimizers.append(wrapped)
        if self._verify is not None:
            self._verify.attach(wrapped)
        return wrapped

    def _register_scheduler(self, scheduler: Any) -> Any:
        optimizers: Any = self._optimizers
        for candidate in self._optimizers:
            if getattr(scheduler, "optimizer", None) is getattr(candidate, "optimizer", candidate):
                optimizers = candidate
                break
        wrapped = self._strategy.wrap_scheduler(
            scheduler, optimizers, self.step_scheduler_with_optimizer, self.split_batches
        )
        _mark_prepared(wrapped)
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Set the model up for the run: placed, converted for the precision, wrapped by the strategy
        (not in ``evaluation_mode``), compiled when asked. A model prepared before is returned as is.

        Args:
            model: the model to prepare.
            device_placement: move the model to the device; `None` (the default) uses the Accelerator's setting.
            evaluation_mode: prepare for inference only, without the distributed wrapper (default `False`).

        Returns:
            The prepared model.

        Raises:
            TypeError: if ``model`` is not a ``torch.nn.Module``.
            ValueError: a model with weights on the ``meta`` device that no offload hook holds
                (`UnloadedWeightsError`), or one dispatched over several
                devices in a distributed run.
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"prepare_model takes a torch.nn.Module, got {type(model).__name__}")
        if _is_prepared(model):
            return model
        self._check_device_map(model)
        self._check_weights_loaded(model, evaluation_mode)
        prepared = self._strategy.setup([model], [], [], [self._placement(device_placement)], evaluation_mode)
        registered = self._register_model(prepared.models[0])
        self._verify_prepared()
        return registered

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> Any:
        """Wrap the optimizer so it steps only on sync steps, through the precision (gradient scaler).

        Args:
            optimizer: the optimizer to prepare.
            device_placement: move the optimizer's state to the device; `None` (the default) uses the
                Accelerator's setting.

        Returns:
            The prepared optimizer (an ``AcceleratedOptimizer``).
        """
        if isinstance(optimizer, AcceleratedOptimizer):
            self._remember(optimizer)
            return optimizer
        prepared = self._strategy.setup([], [optimizer], [], [])
        registered = self._register_optimizer(prepared.optimizers[0], self._placement(device_placement))
        self._verify_prepared()
        return registered

    def prepare_scheduler(self, scheduler: Any) -> Any:
        """Wrap the scheduler so it follows the optimizer's real steps.

        Args:
            scheduler: the learning-rate scheduler to prepare.

        Returns:
            The prepared scheduler (an ``AcceleratedScheduler``).
        """
        if isinstance(scheduler, AcceleratedScheduler) or _is_prepared(scheduler):
            self._remember(scheduler)
            return scheduler
        prepared = self._strategy.setup([], [], [scheduler], [])
        registered = self._register_scheduler(prepared.schedulers[0])
        self._verify_prepared()
        return registered

    def prepare_data_loader(
        self, data_loader: Any, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        """Shard the data loader over the data-parallel processes and move its batches to the device.

        Processes that share a data-parallel rank (tensor or context parallel peers) get the same batches.

        Args:
            data_loader: the data loader to prepare.
            device_placement: move batches to the device; `None` (the default) uses the Accelerator's setting.
            slice_fn_for_dispatch: with ``dispatch_batches``, the function that cuts each process's share out
                of a batch (default `None`: slice every tensor on its first dimension).

        Returns:
            The prepared data loader.
        """
        if _is_prepared(data_loader) or isinstance(data_loader, _prepared_loader_types()):
            self._remember(data_loader)
            return data_loader
        config = self.dataloader_config
        prepared = self._strategy.setup_data_loader(
            data_loader,
            split_batches=self.split_batches,
            put_on_device=self._placement(device_placement),
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=getattr(config, "data_seed", None),
            non_blocking=config.non_blocking,
            use_stateful_dataloader=self.use_stateful_dataloader,
            replay_epoch_on_resume=config.replay_epoch_on_resume,
        )
        _mark_prepared(prepared)
        self._dataloaders.append(prepared)
        self._verify_prepared()
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts after the first ``num_batches`` batches (to resume mid-epoch).

        Args:
            dataloader: the (prepared) data loader to skip batches of.
            num_batches: the number of batches to skip (default `0`).

        Returns:
            A data loader that yields the remaining batches.
        """
        return self._strategy.skip_first_batches(dataloader, num_batches)

    # -- backward, accumulation, synchronisation --------------------------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward of ``loss``: divided by the accumulation steps, scaled by the precision, run by the strategy.

        Args:
            loss: the scalar loss to compute gradients of.
            **kwargs: keyword arguments passed on to the underlying ``backward`` call.
        """
        if self._verify is not None:
            self._verify.on_backward(loss)
        self._strategy.backward(loss, self.gradient_state.plugin_kwargs["num_steps"], **kwargs)

    def _do_sync(self) -> None:
        gradient_state = self.gradient_state
        if gradient_state.sync_with_dataloader and gradient_state.end_of_dataloader:
            self.step = 0
            gradient_state.sync_gradients = True
        else:
            self.step += 1
            gradient_state.sync_gradients = (self.step % gradient_state.plugin_kwargs["num_steps"]) == 0

    def check_preemption(self) -> None:
        """With ``save_on_preemption``: if any process received SIGTERM, save a checkpoint on every
        process and exit with status 143; otherwise return at once.

        `accumulate()` calls it when a step starts. A loop without ``accumulate`` calls it first
        thing in the loop body (after the batch was read: the checkpoint resumes at that batch).
        Every process must call it at the same step (it is a collective).
        """
        watch = self._preemption
        if watch is None:
            return
        from accel_train.preemption import PREEMPTION_EXIT_CODE, agree

        if not agree(watch.requested, self.state):
            return
        self._rewind_active_loader = True
        try:
            folder = self.save_state(async_save=False)  # the process exits next: written before it does
        finally:
            self._rewind_active_loader = False
        self.print(
            f"accel: preemption requested ({watch.signal_name or 'by another process'}): saved {folder}, "
            f"exiting with status {PREEMPTION_EXIT_CODE}"
        )
        if self.trackers:
            from accel_tracking import tracking

            tracking.finish_all(self.trackers)  # flush what was logged; the process group ends at exit
        watch.uninstall()
        raise SystemExit(PREEMPTION_EXIT_CODE)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Accumulate gradients: no gradient sync except every ``num_steps`` batches and on the last batch.

        Args:
            *models: the prepared models whose gradient synchronization is skipped on accumulation steps.
        """
        if self._preemption is not None:
            self.check_preemption()
        self._do_sync()
        if self.gradient_state.sync_gradients or not self.state.use_distributed or self.gradient_state.sync_each_batch:
            yield
            return
        with contextlib.ExitStack() as stack:
            for model in models:
                stack.enter_context(self._strategy.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module | None = None) -> Iterator[None]:
        """Keep gradients local inside the block (no all-reduce / reduce-scatter); no-op in one process.

        Args:
            model: the prepared model whose gradients are not synchronized (default `None`).
        """
        models = [model] if model is not None else list(self._models)
        if not self.state.use_distributed:
            yield
            return
        with contextlib.ExitStack() as stack:
            for each in models:
                stack.enter_context(self._strategy.no_sync(each))
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of ``model`` synchronise gradients, even inside `no_sync()`.

        Args:
            model: the prepared model whose next backward synchronizes gradients.
        """
        if not self.state.use_distributed:
            yield
            return
        with self._strategy.force_sync(model):
            yield

    @contextlib.contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """The precision's forward context for the block (nothing in full precision).

        Args:
            autocast_handler: an ``AutocastKwargs`` overriding the Accelerator's autocast settings for this
                block (default `None`).
        """
        with self.precision.forward_context(autocast_handler):
            yield

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler (owned by the precision; ``None`` otherwise)."""
        return self.precision.scaler

    @property
    def native_amp(self) -> bool:
        """True when mixed precision uses PyTorch's native autocast."""
        return self.precision.native_amp

    def _optimizer_list(self, optimizer: Any) -> list[Any]:
        if optimizer is None:
            return list(self._optimizers)
        return list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16-scaled gradients by the scale (no-op without a gradient scaler).

        Args:
            optimizer: the optimizer (or list of optimizers) whose gradients to unscale; `None` (the default)
                unscales those of every prepared optimizer.
        """
        self._strategy.unscale_gradients(self._optimizer_list(optimizer))

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor | float | None:
        """Clip gradients by their total norm, over shards when sharded, after unscaling; returns the norm.

        Args:
            parameters: the parameters (or a single tensor) whose gradients to clip.
            max_norm: the largest allowed total norm.
            norm_type: the order of the norm (default `2`; ``inf`` for the largest absolute value).

        Returns:
            The total norm of the gradients, before clipping: a tensor; under DeepSpeed (whose engine clips
            in its step) the norm the engine measured, as a Python float (``None`` before its first step).
        """
        return self._strategy.clip_grad_norm_(parameters, max_norm, norm_type, self._optimizers)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """``torch.nn.utils.clip_grad_value_`` after unscaling fp16 gradients.

        Args:
            parameters: the parameters (or a single tensor) whose gradients to clip.
            clip_value: the largest allowed absolute value of a gradient.
        """
        self._strategy.clip_grad_value_(parameters, clip_value, self._optimizers)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Fused backward and update of LOMO / AdaLomo optimizers (``pip install lomo-optim``).

        Args:
            loss: the scalar loss to compute gradients of.
            learning_rate: the learning rate of the fused update.
        """
        from accel_state.imports import is_lomo_available

        if not is_lomo_available():
            raise ImportError(f"lomo_backward needs the LOMO optimizers: {install_hint('lomo-optim')}")
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
        """Train on uneven per-process inputs (``torch.distributed.algorithms.Join`` under DDP).

        Args:
            joinables: the models or optimizers (``Joinable`` objects) taking part in the join.
            even_batches: overrides the data loaders' ``even_batches`` inside the block; `None` (the default)
                keeps it.
        """
        if not self.use_distributed:
            yield
            return
        saved: list[tuple[Any, bool]] = []
        if even_batches is not None:
            for loader in self._dataloaders:
                sampler = getattr(loader, "batch_sampler", None)
                if sampler is not None and hasattr(sampler, "even_batches"):
                    saved.append((sampler, sampler.even_batches))
                    sampler.even_batches = even_batches
        try:
            with self._strategy.join(joinables):
                yield
        finally:
            for sampler, value in saved:
                sampler.even_batches = value

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """The data loader adapted to the strategy's sequence parallelism (DeepSpeed Ulysses), or as it is.

        Args:
            dl: the data loader to adapt.
            model: the prepared model the batches are fed to.

        Returns:
            The adapted data loader, or ``dl`` itself without sequence parallelism.
        """
        return self._strategy.ulysses_dl_adapter(dl, model)

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config that ``prepare`` resolved (every ``"auto"`` filled) for the last model it
        prepared under DeepSpeed: the active plugin's ``deepspeed_config``, the dict the engine was built
        from, which scripts and callbacks read.

        Raises:
            AttributeError: before ``prepare`` set it (no model prepared under DeepSpeed yet), so
                ``hasattr(accelerator, "deepspeed_config")`` answers as with the documented system.
        """
        config = getattr(self._strategy, "resolved_config", None)
        if config is None:
            raise AttributeError(
                "accelerator.deepspeed_config is set by `accelerator.prepare(model, ...)` under DeepSpeed, and no "
                "model has been prepared with DeepSpeed yet; before that, read "
                "`accelerator.state.deepspeed_plugin.deepspeed_config`"
            )
        return config  # type: ignore[no-any-return]

    @property
    def deepspeed_engine_wrapped(self) -> Any:
        """The DeepSpeed engine wrapper of the prepared model (``None`` outside DeepSpeed)."""
        return getattr(self._strategy, "engine_wrapper", None)

    # -- models -----------------------------------------------------------------------------------

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's model from inside the strategy / compile / mixed-precision wrappers.

        Args:
            model: the prepared model to unwrap.
            keep_fp32_wrapper: keep the forward wrapper that casts outputs back to fp32 (default `True`).
            keep_torch_compile: keep the ``torch.compile`` wrapper (default `True`).

        Returns:
            The unwrapped model.
        """
        return self._strategy.unwrap_model(
            model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's full state dict: gathered from every rank when sharded (call it on every rank),
        offloaded weights read back.

        Args:
            model: the (prepared) model to take the state dict of.
            unwrap: unwrap the model first, so the keys carry no wrapper prefixes (default `True`).

        Returns:
            The full state dict of the model.
        """
        return self._strategy.model_state_dict(model, unwrap=unwrap)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when the model (or a submodule) was dispatched over several devices by a device map.

        Args:
            model: the model to check.

        Returns:
            Whether any module's ``hf_device_map`` spans more than one device.
        """
        for module in model.modules():
            device_map = getattr(module, "hf_device_map", None)
            if device_map is not None and len(set(device_map.values())) > 1:
                return True
        return False

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references this Accelerator holds, collect garbage and reset `step`.

        Args:
            *objects: objects to release as well (the caller should rebind them to the returned values).

        Returns:
            A list of ``None``, one per object.
        """
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
        """Profile the block with ``torch.profiler``; writes ``profile_{rank}.json`` to ``output_trace_dir``.

        Args:
            profile_handler: a ``ProfileKwargs`` with the profiler settings; `None` (the default) uses the
                Accelerator's, or the defaults.

        Yields:
            The running ``torch.profiler.profile`` object.
        """
        from accel_train.kwargs_handlers import ProfileKwargs

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
        """Shard ``buffers`` along their sequence dimension over the context-parallel ranks inside the
        block (the strategy's context parallelism); without context parallelism this does nothing.

        Args:
            buffers: the tensors to shard, such as input ids, labels and position ids (default `None`).
            buffer_seq_dims: the sequence dimension of each buffer (default `None`).
            no_restore_buffers: the buffers not restored to their full contents after the block (default `None`).
        """
        with self._strategy.context_parallel(buffers, buffer_seq_dims, no_restore_buffers):
            yield

    def __repr__(self) -> str:
        return f"Accelerator(distributed_type={self.distributed_type}, num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r}, device={self.device})"


def _is_prepared(obj: Any) -> bool:
    return bool(getattr(obj, "_is_accelerate_prepared", False))


def _mark_prepared(obj: Any) -> None:
    """Flag an object as prepared (the documented ``_is_accelerate_prepared`` attribute)."""
    try:
        obj._is_accelerate_prepared = True
    except (AttributeError, TypeError):
        pass

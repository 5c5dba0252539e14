"""DeepSpeed: ZeRO stages 0-3 (with CPU / NVMe offload) through DeepSpeed's engine.

One ``prepare`` call hands one model, with its optimizer and scheduler, to ``deepspeed.initialize``
after the active plugin's config has had its ``"auto"`` values filled from what the call sees. The
engine then owns the step: ``accelerator.backward`` runs ``engine.backward`` and, at accumulation
boundaries, ``engine.step`` (clipping, optimizer, scheduler, zero_grad); the optimizer and scheduler
that ``prepare`` returns only report. Checkpoints are the engine's own, written inside the
checkpoint folder that ``save_state`` publishes atomically.

Mixed precision is the engine's business too (the config's ``fp16`` / ``bf16`` sections): the
precision object does no autocast and has no gradient scaler under this strategy. ``fp8`` puts torchao's
FP8 layers in the model before the engine is built and runs the rest in bf16.

``ParallelismConfig(sp_size=N)`` adds DeepSpeed's ALST/Ulysses sequence parallelism
(`sequence_parallel`): the model's attention is registered with Ulysses, its groups go to
``deepspeed.initialize`` as ``mpu``, data loaders of the same ``prepare`` call are adapted, and the
batch sizes count data-parallel ranks only (``num_processes // sp_size``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from accel_state.enums import PrecisionType
from accel_state.ports import free_port
from accel_train import checkpointing as ckpt
from accel_train.checkpoint.file_io import writing
from accel_train.precisions.base import Precision
from accel_train.precisions.engine import EnginePrecision, no_scaler
from accel_train.precisions.fp8 import EngineFP8Precision
from accel_train.strategies.base import CheckpointEntry, Prepared, Strategy
from accel_train.strategies.deepspeed import config as dsc
from accel_train.strategies.deepspeed.utils import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    import_deepspeed,
    map_pytorch_optim_to_deepspeed,
)
from accel_train.strategies.deepspeed.zero3_state import gather_zero3_state_dict, is_frozen_zero3, load_zero3_state_dict

__all__ = ["DeepSpeedStrategy", "EnginePrecision"]

logger = logging.getLogger(__name__)

_MODEL_TAG = ckpt.FILE_NAMES["engine"]
_OPTIMIZER_MARKER = ckpt.FILE_NAMES["engine_optimizer"]
_FROZEN_WEIGHTS = ckpt.model_file(0, True)


def _engine_tag(index: int) -> str:
    return _MODEL_TAG if index == 0 else f"{_MODEL_TAG}_{index}"


def _optimizer_marker(index: int) -> str:
    return f"{_OPTIMIZER_MARKER}.json" if index == 0 else f"{_OPTIMIZER_MARKER}_{index}.json"


def _is_engine(model: Any) -> bool:
    return type(model).__name__ in ("DeepSpeedEngine", "PipelineEngine") and hasattr(model, "module")


class DeepSpeedStrategy(Strategy):
    """ZeRO data parallelism through ``deepspeed.initialize`` and the engine's step and checkpoints."""

    name = "deepspeed"
    is_sharded = True
    backend_steps_optimizer = True
    #: DeepSpeed's engine runs fp16 / bf16 itself; fp8 is torchao's layers with the engine in bf16.
    precisions = frozenset({PrecisionType.NO, PrecisionType.FP16, PrecisionType.BF16, PrecisionType.FP8})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from accel_train.checkpoint.deepspeed_io import DeepSpeedCheckpointIO
        from accel_train.checkpoint.file_io import CheckpointIO

        if self._checkpoint_io is None or type(self._checkpoint_io) is CheckpointIO:
            self._checkpoint_io = DeepSpeedCheckpointIO()  # the engine's files hold a few DeepSpeed types
        self.engines: list[Any] = []
        self.engine_wrapper: DeepSpeedEngineWrapper | None = None
        self._engine_optimizers: dict[int, Any] = {}
        self._engine_schedulers: set[int] = set()
        #: the active plugin's config as resolved by the last ``prepare`` of a model (``None`` before)
        self.resolved_config: dict[str, Any] | None = None
        self._pristine: dict[int, dict[str, Any]] = {}
        self._clip_warned = False
        self._sp_mpu: Any = None
        if self.state is not None and getattr(self.state, "deepspeed_plugins", None):
            self._configure()

    # -- before the strategy exists ------------------------------------------------------------------

    @classmethod
    def grad_scaler_factory(cls) -> Callable[..., Any] | None:
        return no_scaler

    @classmethod
    def precision_for(cls, precision_cls: type[Precision], mode: str) -> type[Precision]:
        return EngineFP8Precision if str(mode) == "fp8" else EnginePrecision

    @classmethod
    def validate(cls, state: Any, precision_cls: type[Precision], mode: str) -> None:
        """DeepSpeed is installed; every plugin's fp16 / bf16 sections agree with ``mixed_precision``.

        Checks only (on copies of the configs): the connector brings the plugins and the state in line
        (`resolved_mixed_precision()`, `apply_settings()`).
        """
        import_deepspeed()
        for plugin in (state.deepspeed_plugins or {}).values():
            dsc.resolve_mixed_precision(copy.deepcopy(plugin.deepspeed_config), str(mode))
        device = getattr(getattr(state, "device", None), "type", None)
        if str(mode) == "fp16" and device == "cpu":
            raise ValueError(
                "mixed_precision='fp16' cannot run with the deepspeed strategy on CPU: DeepSpeed's CPU accelerator "
                "has no fp16 (it would refuse it when the engine is built); use 'bf16' or 'no' on CPU"
            )
        sp_size = _sp_size(state)
        if sp_size > 1:
            from accel_train.strategies.deepspeed import sequence_parallel

            if state.num_processes % sp_size:
                raise ValueError(
                    f"ParallelismConfig(sp_size={sp_size}) splits each sequence over {sp_size} ranks, but the run "
                    f"has {state.num_processes} processes: launch a multiple of {sp_size} processes"
                )
            sequence_parallel._require_ulysses()

    @classmethod
    def resolved_mixed_precision(cls, state: Any, mode: str) -> str:
        """As documented, a config that enables fp16 or bf16 itself decides the run's mixed precision
        (``fp8``: FP8 layers, the engine in bf16)."""
        if not getattr(state, "deepspeed_plugins", None):
            return mode
        config = copy.deepcopy(state.deepspeed_plugin.deepspeed_config)
        dsc.resolve_mixed_precision(config, str(mode))
        effective = dsc.effective_mixed_precision(config)
        return "fp8" if str(mode) == "fp8" and effective == "bf16" else effective

    @classmethod
    def apply_settings(cls, state: Any, requested_mode: str, precision: Precision) -> None:
        """Every plugin's fp16 / bf16 sections follow the requested ``mixed_precision`` (users read the
        resolved config back from the plugin, as documented)."""
        for plugin in (getattr(state, "deepspeed_plugins", None) or {}).values():
            plugin.set_mixed_precision(requested_mode)

    def _configure(self) -> None:
        """Register ZeRO-3 initialisation with transformers (its ``from_pretrained`` builds partitioned)."""
        active = self.state.deepspeed_plugin
        if active.zero3_init_flag:
            active.set_deepspeed_weakref()

    # -- set-up -------------------------------------------------------------------------------------

    @property
    def plugin(self) -> Any:
        """The active DeepSpeed plugin."""
        return self.state.deepspeed_plugin

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Prepared:
        if not models:
            if optimizers or schedulers:
                raise ValueError(
                    "under DeepSpeed the optimizer and scheduler are set up with their model: pass the model, "
                    "optimizer and scheduler to the same `accelerator.prepare` call"
                )
            return Prepared([], [], [])
        if len(models) > 1 or len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError(
                f"a DeepSpeed engine holds one model, one optimizer and one scheduler, but this `prepare` call got "
                f"{len(models)} model(s), {len(optimizers)} optimizer(s) and {len(schedulers)} scheduler(s); "
                "prepare each model in its own call (several models: one DeepSpeedPlugin per model, selected "
                "with `accelerator.state.select_deepspeed_plugin(name)` before each call)"
            )
        model = models[0]
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        plugin = self.plugin
        if isinstance(self.precision, EngineFP8Precision):
            model = self.precision.convert_module(model)
            if isinstance(optimizer, torch.optim.Optimizer):
                self.precision.point_optimizer(optimizer)
        config = self._resolved_config(plugin, model, optimizer, scheduler, data_loaders)
        mpu = self._sequence_parallel(model, config)
        engine, ds_optimizer, ds_scheduler = self._initialize(config, model, optimizer, scheduler, mpu)
        plugin.deepspeed_config.clear()
        plugin.deepspeed_config.update(config)
        self.resolved_config = plugin.deepspeed_config  # accelerator.deepspeed_config, as documented
        self.engines.append(engine)
        out_optimizers: list[Any] = []
        if optimizer is not None:
            self._engine_optimizers[id(ds_optimizer)] = engine
            out_optimizers.append(ds_optimizer)
            if self.engine_wrapper is None:
                self.engine_wrapper = DeepSpeedEngineWrapper(engine)
            else:
                logger.warning(
                    "a second trained DeepSpeed engine was prepared on this Accelerator; accelerator.backward "
                    "steps the first one. Train each model with its own Accelerator (see 'Using multiple "
                    "models with DeepSpeed')."
                )
        out_schedulers: list[Any] = []
        if scheduler is not None:
            if ds_scheduler is not None:
                self._engine_schedulers.add(id(ds_scheduler))
                out_schedulers.append(ds_scheduler)
            else:
                out_schedulers.append(scheduler)
        return Prepared([engine], out_optimizers, out_schedulers)

    def _resolved_config(
        self, plugin: Any, model: torch.nn.Module, optimizer: Any, scheduler: Any, data_loaders: Sequence[Any]
    ) -> dict[str, Any]:
        """The plugin's config with every ``"auto"`` filled from this call; errors name what is wrong."""
        pristine = self._pristine.setdefault(id(plugin), copy.deepcopy(plugin.deepspeed_config))
        config = copy.deepcopy(pristine)
        _check_stand_ins(config, optimizer, scheduler)
        num_processes = self.state.num_processes
        from accel_state.state import GradientState

        gradient_state = GradientState()
        micro = dsc.micro_batch_size(
            [_per_process_batch(loader, num_processes) for loader in data_loaders], take_min=plugin.is_train_batch_min
        )
        steps = dsc.resolve_batch_sizes(
            config,
            micro,
            gradient_state.num_steps,
            num_processes // _sp_size(self.state),
            training=optimizer is not None,
        )
        if optimizer is not None and steps != gradient_state.num_steps:
            # Documented: a concrete value of the DeepSpeed config wins over the Accelerator's.
            logger.info("gradient accumulation steps set to %d by the DeepSpeed config", steps)
            gradient_state.plugin_kwargs["num_steps"] = steps
        values: dict[str, Any] = {
            "gradient_clipping": plugin.gradient_clipping if plugin.gradient_clipping not in (None, "auto") else None,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save": plugin.zero3_save_16bit_model,
        }
        values.update(dsc.hidden_size_values(config, model))
        if isinstance(optimizer, DummyOptim):
            values["optimizer.params.lr"] = optimizer.lr
            values["optimizer.params.weight_decay"] = optimizer.weight_decay
            values.update({f"optimizer.params.{key}": value for key, value in optimizer.kwargs.items()})
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
            inner = scheduler.optimizer
            defaults = getattr(inner, "defaults", None)
            max_lr = defaults["lr"] if isinstance(defaults, dict) and "lr" in defaults else getattr(inner, "lr", None)
            values.update(
                dsc.scheduler_values(
                    max_lr,
                    scheduler.warmup_num_steps,
                    scheduler.total_num_steps,
                    num_processes,
                    _split_batches(data_loaders),
                )
            )
        dsc.fill_auto(config, values)
        dsc.fill_auto(config, dsc.ENGINE_DEFAULTS)
        left = list(dsc.auto_keys(config))
        if left:
            raise dsc.unresolved_error(left)
        stage = dsc.get_value(config, "zero_optimization.stage", 0)
        if isinstance(optimizer, torch.optim.Optimizer) and not isinstance(optimizer, DummyOptim) and stage:
            # As documented: a client optimizer is allowed with ZeRO (DeepSpeed tests only a few).
            config.setdefault("zero_allow_untested_optimizer", True)
        return config

    def _sequence_parallel(self, model: torch.nn.Module, config: dict[str, Any]) -> Any:
        """Ulysses registered for ``model`` under ``sp_size`` > 1; DeepSpeed's groups (``mpu``), else ``None``."""
        sp_size = _sp_size(self.state)
        if sp_size == 1:
            return None
        from accel_train.strategies.deepspeed import sequence_parallel

        self._ensure_comm(import_deepspeed())
        micro = int(dsc.get_value(config, "train_micro_batch_size_per_gpu"))
        handler = self.state.parallelism_config.sp_handler
        self._sp_mpu = sequence_parallel.register_with_transformers(model, handler, sp_size, micro)
        return self._sp_mpu

    def _initialize(
        self, config: dict[str, Any], model: torch.nn.Module, optimizer: Any, scheduler: Any, mpu: Any = None
    ) -> tuple[Any, Any, Any]:
        deepspeed = import_deepspeed()
        self._ensure_comm(deepspeed)
        self.plugin.set_moe_leaf_modules(model)
        kwargs: dict[str, Any] = {"model": model, "config": config, "dist_init_required": False}
        if mpu is not None:
            kwargs["mpu"] = mpu
        engine_scheduler = False
        if optimizer is not None:
            if isinstance(optimizer, DummyOptim):
                kwargs["model_parameters"] = optimizer.params
            else:
                offload = dsc.get_value(config, "zero_optimization.offload_optimizer.device", "none")
                if offload not in (None, "none") and config.get("zero_force_ds_cpu_optimizer", True):
                    optimizer = map_pytorch_optim_to_deepspeed(optimizer)
                kwargs["optimizer"] = optimizer
        if isinstance(scheduler, DummyScheduler):
            if scheduler.lr_scheduler_callable is not None:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
            engine_scheduler = True
        elif scheduler is not None:
            from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

            if type(scheduler).__name__ in VALID_LR_SCHEDULES:
                kwargs["lr_scheduler"] = scheduler
                engine_scheduler = True
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(**kwargs)
        return engine, ds_optimizer, ds_scheduler if engine_scheduler else None

    def _ensure_comm(self, deepspeed: Any) -> None:
        """DeepSpeed's communication layer over the run's process group (started for one process too)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ.setdefault("RANK", str(self.state.process_index))
            os.environ.setdefault("LOCAL_RANK", str(self.state.local_process_index))
            os.environ.setdefault("WORLD_SIZE", str(self.state.num_processes))
        backend = getattr(self.state, "backend", None) or ("nccl" if self.device.type == "cuda" else "gloo")
        if not deepspeed.comm.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)

    def wrap_optimizer(self, optimizer: Any, device_placement: bool) -> Any:
        if id(optimizer) in self._engine_optimizers:
            return DeepSpeedOptimizerWrapper(optimizer)
        return super().wrap_optimizer(optimizer, device_placement)

    def wrap_scheduler(self, scheduler: Any, optimizers: Any, step_with_optimizer: bool, split_batches: bool) -> Any:
        if id(scheduler) in self._engine_schedulers:
            return DeepSpeedSchedulerWrapper(scheduler, optimizers)
        return super().wrap_scheduler(scheduler, optimizers, step_with_optimizer, split_batches)

    # -- training step ------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, accumulation_steps: int = 1, **kwargs: Any) -> None:
        """``engine.backward`` (the engine divides by its accumulation steps), then ``engine.step`` when
        gradients sync (the accumulation boundary)."""
        if self.engine_wrapper is None:
            raise RuntimeError(
                "accelerator.backward under DeepSpeed needs a model prepared together with its optimizer "
                "(a DeepSpeed engine that trains); none was prepared on this Accelerator"
            )
        from accel_state.state import GradientState

        self.engine_wrapper.backward(loss, sync_gradients=GradientState().sync_gradients, **kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Nothing to enter: the engine knows the accumulation boundary from ``backward``."""
        return contextlib.nullcontext()

    def unscale_gradients(self, optimizers: Iterable[Any]) -> None:
        """Nothing: the engine unscales fp16 gradients in its step."""

    def clip_grad_norm_(  # type: ignore[override]
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> float | None:
        """The engine clips in its step (``gradient_clipping`` of the config); returns the norm it measured,
        as a float (``None`` before the engine measured one), as documented."""
        clipping = dsc.get_value(self.plugin.deepspeed_config, "gradient_clipping", 0.0)
        if not self._clip_warned and float(clipping or 0.0) != float(max_norm):
            logger.warning(
                "under DeepSpeed the engine clips gradients to the config's gradient_clipping=%s, not to "
                "max_norm=%s; set gradient_clipping in the DeepSpeed config (or the plugin)",
                clipping,
                max_norm,
            )
            self._clip_warned = True
        if self.engine_wrapper is None:
            return None
        norm = self.engine_wrapper.get_global_grad_norm()
        return None if norm is None else float(norm)  # a Python float, as documented

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor], clip_value: float, optimizers: Iterable[Any]
    ) -> None:
        raise ValueError(
            "DeepSpeed clips gradients by norm only: use `accelerator.clip_grad_norm_` and set gradient_clipping "
            "in the DeepSpeed config (DeepSpeed and FSDP do not support `clip_grad_value_`. Use `clip_grad_norm_` "
            "instead.)"
        )

    # -- models and their state -----------------------------------------------------------------------

    def _engine_of(self, model: Any) -> Any:
        if _is_engine(model):
            return model
        for engine in self.engines:
            if engine.module is model:
                return engine
        return None

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict; under ZeRO-3 gathered from every rank (all ranks call this), which needs
        the 16-bit export to be enabled, as documented."""
        engine = self._engine_of(model)
        if engine is None or engine.zero_optimization_stage() < 3:
            module = engine.module if engine is not None else model
            return {
                name: value.detach().clone() if isinstance(value, torch.Tensor) else value
                for name, value in module.state_dict().items()
            }
        if not engine.zero_gather_16bit_weights_on_model_save():
            raise ValueError(
                "Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save` in DeepSpeed "
                "config is False: "
                "the model's weights are partitioned by ZeRO-3 and the 16-bit export is off, so the full state "
                "dict cannot be gathered: set `zero_optimization.stage3_gather_16bit_weights_on_model_save: true` "
                "in the DeepSpeed config (or `zero3_save_16bit_model=True` in the plugin / --zero3_save_16bit_model "
                "true). For fp32 weights, save with `accelerator.save_state(dir)` (or `model.save_checkpoint(dir)`) "
                "and run DeepSpeed's `zero_to_fp32.py` in the checkpoint folder, or call "
                "`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(dir)`."
            )
        return gather_zero3_state_dict(engine.module)

    # -- checkpoints (the engine's own, inside the atomic folder) ------------------------------------------

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:
        return {
            "model": CheckpointEntry(rf"^{_MODEL_TAG}(?:_(\d+))?$", _engine_tag),
            "optimizer": CheckpointEntry(rf"^{_OPTIMIZER_MARKER}(?:_(\d+))?\.json$", _optimizer_marker),
        }

    def checkpoint_settings(self) -> dict[str, Any]:
        """The ZeRO stage and where optimizer states and parameters are offloaded."""
        plugin = self.plugin
        return {
            "zero_stage": plugin.zero_stage,
            "offload_optimizer_device": plugin.offload_optimizer_device,
            "offload_param_device": plugin.offload_param_device,
        }

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        return None

    def save_model_checkpoint(
        self,
        model: torch.nn.Module,
        weights: dict[str, Any] | None,
        folder: str,
        index: int,
        safe_serialization: bool,
        is_writer: bool,
    ) -> str | None:
        """``engine.save_checkpoint(folder, tag)`` on every rank: model, optimizer partitions, engine scheduler."""
        engine = self._engine_of(model)
        if engine is None:
            raise ValueError("save_state under DeepSpeed saves models prepared by this Accelerator (DeepSpeed engines)")
        tag = _engine_tag(index)
        if is_frozen_zero3(engine):
            # DeepSpeed writes nothing for a ZeRO-3 engine without optimizer: gather and write the weights.
            weights = gather_zero3_state_dict(engine.module)
            if is_writer:
                with writing(os.path.join(folder, tag)):
                    os.makedirs(os.path.join(folder, tag), exist_ok=True)
                self.checkpoint_io.save_weights(weights, os.path.join(folder, tag, _FROZEN_WEIGHTS), True)
            return tag
        self.checkpoint_io.save_engine(engine, folder, tag)
        return tag

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        engine = self._engine_of(model)
        if engine is None:
            raise ValueError("load_state under DeepSpeed loads into models prepared by this Accelerator")
        frozen = os.path.join(folder, entry, _FROZEN_WEIGHTS)
        if is_frozen_zero3(engine) and os.path.isfile(frozen):
            load_zero3_state_dict(engine.module, self.checkpoint_io.load_weights(frozen, "cpu"), strict)
            return
        self.checkpoint_io.load_engine(engine, folder, entry, strict=strict)

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str | None:
        """The engine saved the optimizer partitions with its model; a small JSON file says where."""
        name = _optimizer_marker(index)
        inner = getattr(optimizer, "optimizer", optimizer)
        engine = self._engine_optimizers.get(id(inner))
        position = next((i for i, e in enumerate(self.engines) if e is engine), None)
        if is_writer:
            marker = {
                "saved_in": _engine_tag(position) if position is not None else None,
                "zero_stage": engine.zero_optimization_stage() if engine is not None else None,
                "optimizer": type(inner).__name__,
            }
            self.checkpoint_io.save_json(marker, os.path.join(folder, name))
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        """Nothing more to read: the engine loaded the optimizer partitions with its model."""

    # -- sequence parallelism ---------------------------------------------------------------------------

    def ulysses_dl_adapter(self, dataloader: Any, model: Any) -> Any:
        """The data loader adapted for DeepSpeed Ulysses sequence parallelism (the same loader when the
        parallelism config does not ask for it, or before a model was prepared with it).

        ``prepare`` adapts the loaders given with the model; call this for a loader prepared apart.
        """
        if _sp_size(self.state) == 1 or type(dataloader).__name__ == "UlyssesSPDataLoaderAdapter":
            return dataloader
        if self._sp_mpu is None:
            raise RuntimeError(
                "the Ulysses data-loader adapter needs DeepSpeed's sequence-parallel groups, which exist once the "
                "model is prepared: call `accelerator.prepare(model, ...)` first, then adapt the loader"
            )
        from accel_train.strategies.deepspeed import sequence_parallel

        return sequence_parallel.adapt_loader(dataloader, self._sp_mpu, getattr(model, "device", self.device))


# -- helpers --------------------------------------------------------------------------------------


def _sp_size(state: Any) -> int:
    """The DeepSpeed sequence-parallel size of the run (1 without it)."""
    config = getattr(state, "parallelism_config", None)
    return int(config.sp_size) if config is not None and getattr(config, "sequence_parallel_by_deepspeed", False) else 1


def _check_stand_ins(config: dict[str, Any], optimizer: Any, scheduler: Any) -> None:
    """The documented pairings of config-defined optimizer / scheduler and the objects in the code."""
    in_config_opt = "optimizer" in config
    in_config_sched = "scheduler" in config
    if optimizer is not None:
        if in_config_opt and not isinstance(optimizer, DummyOptim):
            raise ValueError(
                f"the DeepSpeed config defines an optimizer and the code passes a {type(optimizer).__name__}: "
                "remove `optimizer` from the config, or pass `accel.utils.DummyOptim(params, lr=...)` in the code"
            )
        if not in_config_opt and isinstance(optimizer, DummyOptim):
            raise ValueError(
                "DummyOptim stands for the optimizer of the DeepSpeed config, but the config has no `optimizer` "
                "section: add one, or pass a real torch optimizer"
            )
    if scheduler is not None:
        if in_config_sched and not isinstance(scheduler, DummyScheduler):
            raise ValueError(
                f"the DeepSpeed config defines a scheduler and the code passes a {type(scheduler).__name__}: "
                "remove `scheduler` from the config, or pass `accel.utils.DummyScheduler(optimizer, ...)`"
            )
        if isinstance(scheduler, DummyScheduler) and not in_config_sched and scheduler.lr_scheduler_callable is None:
            raise ValueError(
                "DummyScheduler stands for the scheduler of the DeepSpeed config, but the config has no "
                "`scheduler` section: add one, or give DummyScheduler an `lr_scheduler_callable`"
            )
    if isinstance(optimizer, DummyOptim) and scheduler is not None and not isinstance(scheduler, DummyScheduler):
        raise ValueError(
            "with the optimizer of the DeepSpeed config (DummyOptim), the scheduler must be a DummyScheduler "
            "(the config's scheduler, or one built by its `lr_scheduler_callable`)"
        )


def _per_process_batch(loader: Any, num_processes: int) -> int | None:
    total = getattr(loader, "total_batch_size", None)
    if isinstance(total, int) and total > 0:
        return max(total // num_processes, 1)
    size = getattr(loader, "batch_size", None)
    return size if isinstance(size, int) else None


def _split_batches(data_loaders: Sequence[Any]) -> bool:
    """True when the prepared loaders split each batch over the processes."""
    for loader in data_loaders:
        sampler = getattr(loader, "batch_sampler", None)
        if getattr(loader, "split_batches", False) or getattr(sampler, "split_batches", False):
            return True
    return False

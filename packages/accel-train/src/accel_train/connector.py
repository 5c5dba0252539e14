"""The connector: constructor arguments + launcher environment + plugins -> strategy, precision, I/O.

It is the one place where an ``Accelerator``'s configuration is interpreted and where combinations
are checked. In order:

1. kwargs handlers are sorted into their slots (one of each kind);
2. plugins are completed from the environment ``accel launch`` wrote (a plugin the script did not
   pass is built when its ``ACCELERATE_USE_*`` variable is set; each plugin reads its own fields);
3. the shared `AcceleratorState` is set up (process group, device);
4. the strategy class is chosen by name from the distributed type (and the parallelism config), the
   precision class from ``mixed_precision``; each validates the pair once;
5. the precision is built (with the strategy's gradient scaler), then the strategy around it.

The Accelerator then only delegates: it never branches on the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accel_state import env_vars
from accel_state.enums import PrecisionType
from accel_state.kwargs import InitProcessGroupKwargs, KwargsHandler
from accel_state.state import AcceleratorState
from accel_train.plugins import TorchDynamoPlugin
from accel_train.precisions import precision_class
from accel_train.precisions.base import Precision
from accel_train.strategies import launcher_flags, strategy_class, strategy_name
from accel_train.strategies.base import Strategy

__all__ = ["HANDLER_SLOTS", "Components", "build", "handler_classes", "sort_handlers"]

#: Kwargs handler class name (in `accel_train.kwargs_handlers`, or accel-state's
#: ``InitProcessGroupKwargs``) -> the Accelerator attribute that holds it.
HANDLER_SLOTS: dict[str, str] = {
    "DistributedDataParallelKwargs": "ddp_handler",
    "GradScalerKwargs": "scaler_handler",
    "InitProcessGroupKwargs": "init_handler",
    "AutocastKwargs": "autocast_handler",
    "ProfileKwargs": "profile_handler",
    "FP8RecipeKwargs": "fp8_recipe_handler",
    "TERecipeKwargs": "te_recipe_handler",
    "MSAMPRecipeKwargs": "msamp_recipe_handler",
    "AORecipeKwargs": "ao_recipe_handler",
}


def handler_classes() -> dict[type, str]:
    """``{handler class: slot}`` (imports the handler classes)."""
    from accel_train import kwargs_handlers

    return {
        (InitProcessGroupKwargs if name == "InitProcessGroupKwargs" else getattr(kwargs_handlers, name)): slot
        for name, slot in HANDLER_SLOTS.items()
    }


@dataclass
class Components:
    """What the connector builds for one Accelerator."""

    state: AcceleratorState
    strategy: Strategy
    precision: Precision
    checkpoint_io: Any
    handlers: dict[str, Any] = field(default_factory=dict)


def sort_handlers(kwargs_handlers: list[KwargsHandler] | None) -> dict[str, Any]:
    """``{slot: handler}`` for every slot of `HANDLER_SLOTS` (``None`` when not given)."""
    slots: dict[str, Any] = dict.fromkeys(HANDLER_SLOTS.values())
    if not kwargs_handlers:
        return slots
    classes = handler_classes()
    for handler in kwargs_handlers:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(f"kwargs_handlers takes KwargsHandler objects, got {type(handler).__name__}")
        slot = classes.get(type(handler))
        if slot is None:
            slot = next((s for cls, s in classes.items() if isinstance(handler, cls)), None)
        if slot is None:
            raise ValueError(
                f"unsupported kwargs handler {type(handler).__name__}; accel takes {sorted(HANDLER_SLOTS)}"
            )
        if slots[slot] is not None:
            raise ValueError(f"you can only pass one {type(handler).__name__} in `kwargs_handlers`")
        slots[slot] = handler
    return slots


def _check_type(value: Any, cls: type, name: str) -> None:
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")


def _plugins(
    deepspeed_plugin: Any,
    deepspeed_plugins: Any,
    fsdp_plugin: Any,
    megatron_lm_plugin: Any,
    torch_tp_plugin: Any,
    parallelism_config: Any,
) -> dict[str, Any]:
    """The parallelism plugins of the run: given ones checked, missing ones built from the environment."""
    from accel_train.parallel_plugins import (
        DeepSpeedPlugin,
        FullyShardedDataParallelPlugin,
        MegatronLMPlugin,
        ParallelismConfig,
        TorchTensorParallelPlugin,
    )

    given = (deepspeed_plugin, deepspeed_plugins, fsdp_plugin, megatron_lm_plugin, torch_tp_plugin, parallelism_config)
    if all(p is None for p in given) and not any(env_vars.read(name) for name in launcher_flags()):
        return dict.fromkeys(
            ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin", "torch_tp_plugin", "parallelism_config")
        )
    if deepspeed_plugins is not None and deepspeed_plugin is not None:
        raise ValueError("give only one of `deepspeed_plugin` and `deepspeed_plugins` (they are aliases)")
    deepspeed = deepspeed_plugin if deepspeed_plugin is not None else deepspeed_plugins
    if deepspeed is None and env_vars.read("ACCELERATE_USE_DEEPSPEED"):
        deepspeed = DeepSpeedPlugin()
    if isinstance(deepspeed, dict):
        if not deepspeed:
            raise ValueError("deepspeed_plugins is an empty dict; give at least one DeepSpeedPlugin")
        for key, plugin in deepspeed.items():
            _check_type(plugin, DeepSpeedPlugin, f"deepspeed_plugins[{key!r}]")
    else:
        _check_type(deepspeed, DeepSpeedPlugin, "deepspeed_plugin")
    if fsdp_plugin is None and env_vars.read("ACCELERATE_USE_FSDP"):
        fsdp_plugin = FullyShardedDataParallelPlugin()
    if megatron_lm_plugin is None and env_vars.read("ACCELERATE_USE_MEGATRON_LM"):
        megatron_lm_plugin = MegatronLMPlugin()
    _check_type(fsdp_plugin, FullyShardedDataParallelPlugin, "fsdp_plugin")
    _check_type(megatron_lm_plugin, MegatronLMPlugin, "megatron_lm_plugin")
    if sum(p is not None for p in (deepspeed, fsdp_plugin, megatron_lm_plugin)) > 1:
        raise ValueError("use only one of DeepSpeed, FSDP and Megatron-LM in one Accelerator")
    _check_type(torch_tp_plugin, TorchTensorParallelPlugin, "torch_tp_plugin")
    if parallelism_config is None:
        parallelism_config = ParallelismConfig.from_env()
    if torch_tp_plugin is not None and torch_tp_plugin.tp_size > 1:
        if parallelism_config is not None and parallelism_config.tp_size not in (1, torch_tp_plugin.tp_size):
            raise ValueError(
                f"torch_tp_plugin.tp_size={torch_tp_plugin.tp_size} contradicts parallelism_config.tp_size="
                f"{parallelism_config.tp_size}; give the size once, in ParallelismConfig(tp_size=...)"
            )
        if parallelism_config is None:
            parallelism_config = ParallelismConfig(tp_size=torch_tp_plugin.tp_size)
    _check_type(parallelism_config, ParallelismConfig, "parallelism_config")
    return {
        "deepspeed_plugin": deepspeed,
        "fsdp_plugin": fsdp_plugin,
        "megatron_lm_plugin": megatron_lm_plugin,
        "torch_tp_plugin": torch_tp_plugin,
        "parallelism_config": parallelism_config,
    }


def _dynamo(dynamo_backend: Any, dynamo_plugin: Any) -> TorchDynamoPlugin:
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("give either `dynamo_backend` or `dynamo_plugin`, not both")
    if dynamo_plugin is None:
        return TorchDynamoPlugin(backend=dynamo_backend)
    _check_type(dynamo_plugin, TorchDynamoPlugin, "dynamo_plugin")
    return dynamo_plugin  # type: ignore[no-any-return]


def _refuse_second_deepspeed(deepspeed: Any) -> None:
    """As documented, the first Accelerator carries every DeepSpeed plugin of the process; a later one
    given its own would be silently ignored by the shared state, so it is refused."""
    from accel_state.state import PartialState

    shared = AcceleratorState._shared_state
    live = shared.get("_initialized") and PartialState._shared_state.get("_initialized")
    if deepspeed is not None and live and shared.get("deepspeed_plugins"):
        raise NotImplementedError(
            "a DeepSpeed plugin cannot be given to a second Accelerator in the same process: the state already "
            f"holds {sorted(shared['deepspeed_plugins'])}. Give all plugins to the first one "
            "(`Accelerator(deepspeed_plugins={'a': ..., 'b': ...})`), create the second with `Accelerator()` and "
            "switch with `accelerator.state.select_deepspeed_plugin(name)`"
        )


def build(
    *,
    mixed_precision: Any = None,
    cpu: bool = False,
    kwargs_handlers: list[KwargsHandler] | None = None,
    deepspeed_plugin: Any = None,
    deepspeed_plugins: Any = None,
    fsdp_plugin: Any = None,
    megatron_lm_plugin: Any = None,
    torch_tp_plugin: Any = None,
    parallelism_config: Any = None,
    dynamo_backend: Any = None,
    dynamo_plugin: Any = None,
) -> Components:
    """Interpret an Accelerator's arguments with the environment; build and validate its components."""
    # mixed_precision is parsed once, here at the edge: the argument, else the launcher's variable (a
    # clear error on a wrong value). Its class is looked up before any process group starts, so a mode
    # that cannot run here fails without side effects.
    explicit = mixed_precision is not None
    requested = PrecisionType.parse(mixed_precision if explicit else env_vars.read("ACCELERATE_MIXED_PRECISION"))
    mixed_precision = requested.value if explicit else None
    handlers = sort_handlers(kwargs_handlers)
    precision_class(requested.value)
    plugins = _plugins(
        deepspeed_plugin, deepspeed_plugins, fsdp_plugin, megatron_lm_plugin, torch_tp_plugin, parallelism_config
    )
    _refuse_second_deepspeed(plugins["deepspeed_plugin"])
    dynamo = _dynamo(dynamo_backend, dynamo_plugin)
    init_kwargs = handlers["init_handler"].to_kwargs() if handlers["init_handler"] is not None else {}
    state = AcceleratorState(
        mixed_precision=mixed_precision,
        cpu=cpu,
        dynamo_plugin=dynamo,
        _from_accelerator=True,
        **plugins,
        **init_kwargs,
    )
    mode = state.mixed_precision
    name = strategy_name(state.distributed_type, state.parallelism_config)
    precision_cls = precision_class(mode)
    try:
        strategy_cls = strategy_class(name)
    except NotImplementedError:
        strategy_cls = None  # refused at prepare time, so that configs are still checked here
    requested_mode = mode
    if strategy_cls is not None:
        strategy_cls.check_precision(state, PrecisionType(mode), precision_cls)
        strategy_cls.validate(state, precision_cls, mode)
        mode = strategy_cls.resolved_mixed_precision(state, mode)
        if mode != requested_mode:  # the backend's config decided (documented): the state reports it
            precision_cls = precision_class(mode)
            if "_mixed_precision" in state.__dict__:
                state._mixed_precision = mode
        precision_cls = strategy_cls.precision_for(precision_cls, mode)
    precision = precision_cls(
        mode,
        state.device,
        autocast_kwargs=handlers["autocast_handler"],
        scaler_kwargs=handlers["scaler_handler"],
        scaler_factory=strategy_cls.grad_scaler_factory() if strategy_cls is not None else None,
        handlers=handlers,
    )
    from accel_train.checkpoint.file_io import CheckpointIO

    checkpoint_io = CheckpointIO()
    strategy: Strategy
    if strategy_cls is not None:
        strategy_cls.apply_settings(state, requested_mode, precision)
    if strategy_cls is None:
        strategy = _Unavailable(name, state, precision, checkpoint_io, handlers)
    else:
        strategy = strategy_cls(state, precision, checkpoint_io, handlers)
    return Components(state, strategy, precision, checkpoint_io, handlers)


class _Unavailable(Strategy):
    """Stands for a documented backend not built yet: the Accelerator is created (its configuration
    checked), and preparing a model, optimizer or scheduler raises the backend's error."""

    def __init__(self, backend: str, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend

    def setup(self, *args: Any, **kwargs: Any) -> Any:
        strategy_class(self.backend)  # raises the BackendNotAvailableError naming the backend
        raise AssertionError("unreachable")

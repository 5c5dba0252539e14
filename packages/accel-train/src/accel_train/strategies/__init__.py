"""Strategies: how a model is spread over processes, one module each, registered by name.

A strategy is found by name through `STRATEGIES` (``name -> "module:Class"``), so its module,
and the backend library behind it, is imported only when a run uses it. Adding a backend is one
module under this package plus one line in the table (or a call to `register_strategy()` from
outside the package). The connector (`accel_train.connector`) picks the name from the launch
configuration with `strategy_name()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accel_state.enums import DistributedType
from accel_train.registry import Registry

if TYPE_CHECKING:
    from accel_train.strategies.base import Strategy

__all__ = ["STRATEGIES", "DDP_TYPES", "register_strategy", "strategy_class", "strategy_name"]

#: Registered strategies: name -> ``"module:Class"`` (imported on first use).
STRATEGIES: dict[str, str] = {
    "single_device": "accel_train.strategies.single_device:SingleDeviceStrategy",
    "ddp": "accel_train.strategies.ddp:DDPStrategy",
    "fsdp": "accel_train.strategies.fsdp.strategy:FSDPStrategy",
    "deepspeed": "accel_train.strategies.deepspeed.strategy:DeepSpeedStrategy",
    "nd_parallel": "accel_train.strategies.nd.strategy:NDParallelStrategy",
    "pipeline": "accel_train.strategies.pipeline.strategy:PipelineStrategy",
    "megatron_lm": "accel_train.strategies.megatron.strategy:MegatronLMStrategy",
    "xla": "accel_train.strategies.xla.strategy:XLAStrategy",
}

#: Documented backends whose strategy is not registered: what to tell the user.
_NOT_YET: dict[str, str] = {}

#: Distributed types run by replicating the model on every process (DistributedDataParallel).
DDP_TYPES = frozenset(
    {
        DistributedType.MULTI_CPU,
        DistributedType.MULTI_GPU,
        DistributedType.MULTI_NPU,
        DistributedType.MULTI_MLU,
        DistributedType.MULTI_SDAA,
        DistributedType.MULTI_MUSA,
        DistributedType.MULTI_XPU,
        DistributedType.MULTI_HPU,
    }
)

_BY_TYPE = {
    DistributedType.NO: "single_device",
    DistributedType.FSDP: "fsdp",
    DistributedType.DEEPSPEED: "deepspeed",
    DistributedType.MEGATRON_LM: "megatron_lm",
    DistributedType.XLA: "xla",
}


def strategy_name(distributed_type: DistributedType, parallelism_config: Any = None) -> str:
    """The registered name of the strategy that runs ``distributed_type``.

    A ``ParallelismConfig`` with tensor, context or sharded-data dimensions asks for the ND-parallel
    strategy whatever the distributed type.
    """
    if distributed_type == DistributedType.DEEPSPEED:
        return "deepspeed"  # DeepSpeed runs its own sequence parallelism (Ulysses, sp_size)
    if (getattr(parallelism_config, "pp_size", 1) or 1) > 1:
        return "pipeline"
    if parallelism_config is not None and not getattr(parallelism_config, "is_trivial", True):
        return "nd_parallel"
    if distributed_type in DDP_TYPES:
        return "ddp"
    return _BY_TYPE.get(distributed_type, str(getattr(distributed_type, "value", distributed_type)).lower())


def _missing(name: str) -> Exception:
    if name in _NOT_YET:
        from accel_train.parallel_plugins import not_available

        return not_available(_NOT_YET[name])
    return KeyError(f"no strategy named {name!r}; registered: {sorted(STRATEGIES)}")


_REGISTRY = Registry("strategy", STRATEGIES, _missing)


def register_strategy(name: str, target: str | type[Strategy], replace: bool = False) -> None:
    """Register a strategy class (or its ``"module:Class"`` path) under ``name``."""
    _REGISTRY.register(name, target, replace)


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``; a clear error for a documented backend not built yet."""
    return _REGISTRY.get(name)  # type: ignore[no-any-return]

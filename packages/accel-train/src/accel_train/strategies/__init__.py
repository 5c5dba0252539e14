"""Strategies: how a model is spread over processes, one module each, registered by name.

Each backend is one row of `BACKENDS`: its name, where its strategy class is (``"module:Class"``, so
its module, and the backend library behind it, is imported only when a run uses it), the distributed
types it runs and the launcher variable that turns it on. Adding a backend is one folder under this
package plus one row (or a call to `register_strategy()` from outside the package). The connector (`accel_train.connector`) picks the name from the launch
configuration with `strategy_name()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel_state.enums import DistributedType
from accel_train.registry import Registry

if TYPE_CHECKING:
    from accel_train.strategies.base import Strategy

__all__ = [
    "BACKENDS",
    "STRATEGIES",
    "DDP_TYPES",
    "Backend",
    "launcher_flags",
    "register_strategy",
    "strategy_class",
    "strategy_name",
]


@dataclass(frozen=True)
class Backend:
    """What the rest of accel needs to know about one backend before its module is imported.

    Args:
        name: the registered strategy name (``Strategy.name``).
        strategy: where its class is, ``"module:Class"`` (imported when a run uses it).
        distributed_types: the distributed types it runs (the connector picks it for them).
        launcher_flag: the ``ACCELERATE_USE_*`` variable with which the launcher turns it on (its plugin
            is then built from the environment), or `None`.
    """

    name: str
    strategy: str
    distributed_types: frozenset[DistributedType] = frozenset()
    launcher_flag: str | None = None


_S = "accel_train.strategies"

#: Every backend, one row each: adding a backend is one folder under this package and one row here (or
#: `register_strategy()` from outside the package). Tensor / context / pipeline layouts of
#: ``ParallelismConfig`` pick ``nd_parallel`` and ``pipeline`` whatever the distributed type (`strategy_name()`).
BACKENDS: tuple[Backend, ...] = (
    Backend("single_device", f"{_S}.single_device:SingleDeviceStrategy", frozenset({DistributedType.NO})),
    Backend(
        "ddp",
        f"{_S}.ddp:DDPStrategy",
        frozenset(
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
        ),
    ),
    Backend("fsdp", f"{_S}.fsdp.strategy:FSDPStrategy", frozenset({DistributedType.FSDP}), "ACCELERATE_USE_FSDP"),
    Backend(
        "deepspeed",
        f"{_S}.deepspeed.strategy:DeepSpeedStrategy",
        frozenset({DistributedType.DEEPSPEED}),
        "ACCELERATE_USE_DEEPSPEED",
    ),
    Backend("nd_parallel", f"{_S}.nd.strategy:NDParallelStrategy", launcher_flag="ACCELERATE_USE_PARALLELISM_CONFIG"),
    Backend("pipeline", f"{_S}.pipeline.strategy:PipelineStrategy"),
    Backend(
        "megatron_lm",
        f"{_S}.megatron.strategy:MegatronLMStrategy",
        frozenset({DistributedType.MEGATRON_LM}),
        "ACCELERATE_USE_MEGATRON_LM",
    ),
    Backend("xla", f"{_S}.xla.strategy:XLAStrategy", frozenset({DistributedType.XLA})),
)

#: Registered strategies: name -> ``"module:Class"`` (imported on first use); `register_strategy()` adds.
STRATEGIES: dict[str, str] = {backend.name: backend.strategy for backend in BACKENDS}

#: Documented backends whose strategy is not registered: what to tell the user.
_NOT_YET: dict[str, str] = {}

#: Distributed types run by replicating the model on every process (DistributedDataParallel).
DDP_TYPES: frozenset[DistributedType] = next(b.distributed_types for b in BACKENDS if b.name == "ddp")

_BY_TYPE: dict[DistributedType, str] = {t: b.name for b in BACKENDS for t in b.distributed_types}


def launcher_flags() -> tuple[str, ...]:
    """The ``ACCELERATE_USE_*`` variables with which the launcher turns a backend on."""
    return tuple(b.launcher_flag for b in BACKENDS if b.launcher_flag is not None)


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

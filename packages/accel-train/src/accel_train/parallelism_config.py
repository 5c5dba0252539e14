"""``ParallelismConfig``: sizes of the data-replicate, data-shard, tensor and context parallel
dimensions, from code or the launcher (``PARALLELISM_CONFIG_*``), and the per-dimension handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_state.enums import ContextParallelCommStrategy
from accel_train.plugin_env import env_value

__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig", "TorchTensorParallelPlugin"]

_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


@dataclass
class TorchTensorParallelConfig:
    """Settings of the tensor-parallel dimension (torch's DTensor tensor parallelism)."""

    enable_async_tp: bool = False


@dataclass
class TorchContextParallelConfig:
    """Settings of the context-parallel dimension: how ranks exchange keys and values."""

    cp_comm_strategy: str = "allgather"

    def __post_init__(self) -> None:
        self.cp_comm_strategy = str(ContextParallelCommStrategy.parse(self.cp_comm_strategy))


@dataclass
class TorchTensorParallelPlugin:
    """Deprecated: tensor parallelism through ``ParallelismConfig(tp_size=...)``."""

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"TorchTensorParallelPlugin.tp_size must be an int >= 1, got {self.tp_size!r}")


@dataclass
class ParallelismConfig:
    """Sizes of the parallel dimensions; their product is the number of processes.

    Sizes left ``None`` take the ``PARALLELISM_CONFIG_*_SIZE`` value the launcher wrote, else 1.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if value is None:
                variable = f"PARALLELISM_CONFIG_{name.upper()}"
                value = env_value(variable, 1) if variable in _ENV_SIZES else 1
                setattr(self, name, value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelismConfig.{name} must be an int >= 1, got {value!r}")
        if self.cp_backend is not None and self.cp_backend not in ("torch", "deepspeed"):
            raise ValueError(
                f"ParallelismConfig.cp_backend={self.cp_backend!r} is not valid; choose torch or deepspeed"
            )
        if self.cp_handler is None and self.cp_size > 1:  # type: ignore[operator]
            self.cp_handler = TorchContextParallelConfig(
                cp_comm_strategy=env_value("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
            )
        if self.tp_handler is None and self.tp_size > 1:  # type: ignore[operator]
            self.tp_handler = TorchTensorParallelConfig()

    @classmethod
    def from_env(cls) -> ParallelismConfig | None:
        """The configuration the launcher asked for (``ACCELERATE_USE_PARALLELISM_CONFIG``), else ``None``."""
        return cls() if env_value("ACCELERATE_USE_PARALLELISM_CONFIG", False) else None

    @property
    def total_size(self) -> int:
        """Product of every dimension's size."""
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def is_trivial(self) -> bool:
        """True when there is at most plain (replicated) data parallelism."""
        return self.dp_shard_size == 1 and self.tp_size == 1 and self.cp_size == 1 and self.sp_size == 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_replicate_size > 1 or self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1  # type: ignore[operator]


_ENV_SIZES = frozenset(
    {
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE",
        "PARALLELISM_CONFIG_TP_SIZE",
        "PARALLELISM_CONFIG_CP_SIZE",
    }
)

"""``ParallelismConfig``: sizes of the data-replicate, data-shard, expert, tensor and context parallel
dimensions, from code or the launcher (``PARALLELISM_CONFIG_*``), and the per-dimension handlers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accel_state.enums import ContextParallelCommStrategy
from accel_train.plugin_env import env_value
from accel_train.strategies.deepspeed.sequence_parallel import DeepSpeedSequenceParallelConfig

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
]

_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "pp_size", "ep_size")
#: Dimensions expert parallelism does not compose with yet (refused by name when both are above 1).
_NOT_WITH_EXPERTS = ("tp_size", "cp_size", "sp_size", "pp_size")


@dataclass
class TorchTensorParallelConfig:
    """Settings of the tensor-parallel dimension (torch's DTensor tensor parallelism).

    ``tp_plan`` maps module names (``*`` matches one name component, e.g. ``layers.*.mlp.up``) to a
    style (``"colwise"``, ``"rowwise"``, ``"colwise_rep"``, ``"rowwise_rep"``, ``"sequence_parallel"``)
    or a torch ``ParallelStyle``; without it the model's own ``tp_plan`` / ``_tp_plan`` is used.

    Args:
        enable_async_tp: Whether torch's asynchronous tensor parallelism (overlapping communication with the
            matmuls) is asked for; kept on the config, accel's tensor-parallel strategy does not read it.
            Defaults to `False`.
        tp_plan: Module-name patterns mapped to tensor-parallel styles, as described above; `None` uses the
            model's own plan. Defaults to `None`.
    """

    enable_async_tp: bool = False
    tp_plan: dict[str, Any] | None = None


@dataclass
class TorchContextParallelConfig:
    """Settings of the context-parallel dimension: how ranks exchange keys and values.

    Args:
        cp_comm_strategy: How the ranks exchange keys and values, `allgather` or `alltoall` (any case).
            Defaults to `"allgather"`.
    """

    cp_comm_strategy: str = "allgather"

    def __post_init__(self) -> None:
        self.cp_comm_strategy = str(ContextParallelCommStrategy.parse(self.cp_comm_strategy))


@dataclass
class TorchTensorParallelPlugin:
    """Deprecated: tensor parallelism through ``ParallelismConfig(tp_size=...)``.

    Args:
        tp_size: Number of processes each tensor-parallel group spans; at least 1. Defaults to `1`.
        torch_device_mesh: A ``DeviceMesh`` to use instead of one built from the sizes. Defaults to `None`.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"TorchTensorParallelPlugin.tp_size must be an int >= 1, got {self.tp_size!r}")


@dataclass
class ParallelismConfig:
    """Sizes of the parallel dimensions; their product is the number of processes.

    Sizes left ``None`` take the ``PARALLELISM_CONFIG_*_SIZE`` value the launcher wrote, else 1.

    Args:
        dp_replicate_size: Number of data-parallel replicas, each holding a full copy of the (sharded) model.
            Defaults to `None` (launcher value, else `1`).
        dp_shard_size: Number of processes the model is sharded over inside a replica (FSDP).
            Defaults to `None` (launcher value, else `1`).
        tp_size: Size of the tensor-parallel dimension. Defaults to `None` (launcher value, else `1`).
        cp_size: Size of the context-parallel dimension (the sequence split across ranks in attention).
            Defaults to `None` (launcher value, else `1`).
        cp_backend: Context-parallel implementation, `torch` or `deepspeed`. Defaults to `None`.
        sp_size: Size of the sequence-parallel dimension (DeepSpeed ALST/Ulysses: each sample's sequence split
            over ``sp_size`` ranks); runs under DeepSpeed only. Defaults to `None` (launcher value, else `1`).
        sp_backend: Sequence-parallel implementation; only `deepspeed`. Defaults to `None` (launcher value,
            else `deepspeed`).
        pp_size: Size of the pipeline-parallel dimension (an accel extension). Defaults to `None`
            (launcher value, else `1`).
        ep_size: Size of the expert-parallel dimension (an accel extension): each mixture-of-experts block's
            experts are split over ``ep_size`` processes, which hold different data for every other layer.
            Composes with ``dp_replicate_size`` and ``dp_shard_size``; not yet with tensor, context, sequence
            or pipeline parallelism. Defaults to `None` (launcher value, else `1`).
        tp_handler: A ``TorchTensorParallelConfig``; `None` builds a default one when ``tp_size`` > 1.
            Defaults to `None`.
        cp_handler: A ``TorchContextParallelConfig``; `None` builds one from the launcher's communication strategy
            when ``cp_size`` > 1. Defaults to `None`.
        sp_handler: A ``DeepSpeedSequenceParallelConfig``; `None` builds one from the launcher's values when
            ``sp_size`` > 1. Defaults to `None`.
        pp_handler: A ``PipelineParallelConfig``; `None` builds a default one when ``pp_size`` > 1.
            Defaults to `None`.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    pp_size: int | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None
    pp_handler: Any = None
    ep_size: int | None = None

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if value is None:
                # each size has its variable in accel_state.env_vars (test_train_nd_parallel.py pins the rows)
                value = env_value(f"PARALLELISM_CONFIG_{name.upper()}", 1)
                setattr(self, name, value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelismConfig.{name} must be an int >= 1, got {value!r}")
        if self.cp_backend is not None and self.cp_backend not in ("torch", "deepspeed"):
            raise ValueError(
                f"ParallelismConfig.cp_backend={self.cp_backend!r} is not valid; choose torch or deepspeed"
            )
        self._check_sequence_parallel()
        if self.ep_size > 1:  # type: ignore[operator]
            others = [f"{name}={getattr(self, name)}" for name in _NOT_WITH_EXPERTS if getattr(self, name) > 1]
            if others:
                raise ValueError(
                    f"ParallelismConfig(ep_size={self.ep_size}) with {', '.join(others)} is not supported: expert "
                    "parallelism composes with dp_replicate_size and dp_shard_size only; set "
                    f"{' and '.join(o.split('=')[0] for o in others)} to 1"
                )
        if self.cp_handler is None and self.cp_size > 1:  # type: ignore[operator]
            self.cp_handler = TorchContextParallelConfig(
                cp_comm_strategy=env_value("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
            )
        if self.tp_handler is None and self.tp_size > 1:  # type: ignore[operator]
            self.tp_handler = TorchTensorParallelConfig()
        if self.pp_size > 1:  # type: ignore[operator]
            from accel_train.strategies.pipeline.config import PipelineParallelConfig

            if self.pp_handler is None:
                self.pp_handler = PipelineParallelConfig()
            elif not isinstance(self.pp_handler, PipelineParallelConfig):
                raise TypeError(
                    f"ParallelismConfig.pp_handler must be a PipelineParallelConfig, got {self.pp_handler!r}"
                )

    def _check_sequence_parallel(self) -> None:
        """``sp_backend`` and ``sp_handler`` from the launcher or checked; sp and cp exclude each other."""
        if self.sp_backend is None:
            self.sp_backend = env_value("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.sp_backend != "deepspeed":
            raise ValueError(
                f"ParallelismConfig.sp_backend={self.sp_backend!r} is not valid; sequence parallelism runs "
                "through DeepSpeed (ALST/Ulysses): sp_backend='deepspeed'"
            )
        if self.sp_size > 1 and self.cp_size > 1:  # type: ignore[operator]
            raise ValueError(
                f"ParallelismConfig has cp_size={self.cp_size} and sp_size={self.sp_size}: context parallelism "
                "(torch) and sequence parallelism (DeepSpeed Ulysses) both split the sequence; set one of them to 1"
            )
        if self.sp_handler is None and self.sp_size > 1:  # type: ignore[operator]
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        elif self.sp_handler is not None and not isinstance(self.sp_handler, DeepSpeedSequenceParallelConfig):
            raise TypeError(
                "ParallelismConfig.sp_handler must be a DeepSpeedSequenceParallelConfig (sp_backend='deepspeed'), "
                f"got {type(self.sp_handler).__name__}"
            )

    @property
    def sequence_parallel_by_deepspeed(self) -> bool:
        """Whether DeepSpeed Ulysses splits sequences (``sp_size`` > 1): DeepSpeed builds those process
        groups itself, so there is no torch mesh."""
        return self.sp_size > 1 and self.sp_backend == "deepspeed"  # type: ignore[operator]

    @property
    def data_parallel_size(self) -> int:
        """Ranks holding different data: ``dp_replicate_size`` x ``dp_shard_size`` x ``ep_size`` (expert-parallel
        peers share their experts but read different batches)."""
        return self.dp_replicate_size * self.dp_shard_size * self.ep_size  # type: ignore[operator]

    @classmethod
    def from_env(cls) -> ParallelismConfig | None:
        """The configuration the launcher asked for (``ACCELERATE_USE_PARALLELISM_CONFIG``), else ``None``."""
        return cls() if env_value("ACCELERATE_USE_PARALLELISM_CONFIG", False) else None

    @property
    def total_size(self) -> int:
        """Product of every dimension's size."""
        return self.data_parallel_size * self.tp_size * self.cp_size * self.sp_size * self.pp_size  # type: ignore[operator]

    @property
    def is_trivial(self) -> bool:
        """True when there is at most plain (replicated) data parallelism."""
        return (
            self.dp_shard_size == 1
            and self.tp_size == 1
            and self.cp_size == 1
            and self.sp_size == 1
            and self.pp_size == 1
            and self.ep_size == 1
        )

    # -- the mesh ------------------------------------------------------------------------------------
    # Dimensions in the fixed order dp_replicate, dp_shard, ep, cp, tp (outermost first): tensor-parallel
    # peers are neighbours, so their traffic stays inside a machine when a machine holds a tp group; the
    # expert all-to-all goes between ep neighbours, and dp_shard x ep is one flattened group for FSDP.

    @property
    def _sizes(self) -> dict[str, int]:
        return {
            "dp_replicate": self.dp_replicate_size,  # type: ignore[dict-item]
            "dp_shard": self.dp_shard_size,  # type: ignore[dict-item]
            "ep": self.ep_size,  # type: ignore[dict-item]
            "cp": self.cp_size,  # type: ignore[dict-item]
            "tp": self.tp_size,  # type: ignore[dict-item]
        }

    @property
    def active_mesh_dims(self) -> list[str]:
        """Names of the dimensions larger than 1, outermost first."""
        return [name for name, size in self._sizes.items() if size > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """The data-parallel dimensions in use (``dp_replicate``, ``dp_shard``, and ``ep``: expert-parallel
        peers read different batches)."""
        return [name for name in ("dp_replicate", "dp_shard", "ep") if self._sizes[name] > 1]

    @property
    def expert_dp_dim_names(self) -> list[str]:
        """The dimensions over which ranks hold the same experts (``dp_replicate``, ``dp_shard``): the mesh
        FSDP2 shards expert weights over."""
        return [name for name in ("dp_replicate", "dp_shard") if self._sizes[name] > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The model-parallel dimensions in use (``cp``, ``tp``)."""
        return [name for name in ("cp", "tp") if self._sizes[name] > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Dimensions over which FSDP shards the parameters that are not experts (data shard, expert and
        context parallel)."""
        return [name for name in ("dp_shard", "ep", "cp") if self._sizes[name] > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Dimensions over which gradients are averaged (every data-parallel and context-parallel one)."""
        return [name for name in ("dp_replicate", "dp_shard", "ep", "cp") if self._sizes[name] > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh FSDP2 shards over: ``dp_shard_cp`` (or the one of ``dp_shard`` / ``cp`` in use),
        preceded by ``dp_replicate`` for HSDP."""
        names = []
        if self.dp_replicate_enabled:
            names.append("dp_replicate")
        shard = self.dp_shard_cp_dim_names
        if len(shard) > 1:
            names.append("dp_shard_cp")
        elif shard:
            names.append(shard[0])
        return names

    def validate_world_size(self, num_processes: int) -> None:
        """Raise unless the sizes multiply to ``num_processes``, naming the product.

        Args:
            num_processes: Number of processes of the run.

        Raises:
            ValueError: The product of the sizes differs from ``num_processes``.
        """
        if self.total_size != num_processes:
            # pp and ep: accel extensions, named only when used
            shown = [name for name in _SIZES if name not in ("pp_size", "ep_size") or getattr(self, name) != 1]
            product = " x ".join(f"{name.removesuffix('_size')} {getattr(self, name)}" for name in shown)
            raise ValueError(
                f"ParallelismConfig sizes multiply to {self.total_size} ({product}) but the run has "
                f"{num_processes} processes; change the sizes so that their product is {num_processes}"
            )

    def build_device_mesh(self, device_type: str) -> Any:
        """The ``DeviceMesh`` of the active dimensions, with the flattened ``dp``, ``dp_shard_cp`` and
        ``dp_cp`` meshes registered on it (a 1-D mesh of all processes when every size is 1).

        Args:
            device_type: Device type of the mesh, e.g. `cuda` or `cpu`.

        Returns `None` under DeepSpeed sequence parallelism (``sp_size`` > 1), whose groups DeepSpeed builds.
        """
        from accel_train.strategies.mesh import build_mesh

        if self.sequence_parallel_by_deepspeed:
            self._device_mesh = None
            return None
        names = self.active_mesh_dims or ["dp_replicate"]
        shape = tuple(max(self._sizes[name], 1) for name in names) if self.active_mesh_dims else (self.total_size,)
        # one dimension too: scripts index mesh["dp_cp"] whatever is active
        flattened = {"dp": self.dp_dim_names, "dp_shard_cp": self.dp_shard_cp_dim_names, "dp_cp": self.dp_cp_dim_names}
        self._flat_meshes: dict[str, Any] = {}
        mesh = build_mesh(device_type, list(zip(names, shape)), flattened, self._flat_meshes)
        self._device_mesh = mesh
        return mesh

    def sub_mesh(self, names: Sequence[str]) -> Any:
        """The sub-mesh of the built mesh over the dimensions ``names`` (one name may be a flattened one, such
        as ``dp_shard_cp``, kept when the mesh was built); ``None`` for no name.

        Args:
            names: dimension names, outermost first.
        """
        if not names:
            return None
        mesh = self.get_device_mesh()
        if len(names) == 1:
            name = names[0]
            return getattr(self, "_flat_meshes", {}).get(name) or mesh[name]
        return mesh[tuple(names)]

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built by `build_device_mesh()` (built now for ``device_type`` if not yet).

        Args:
            device_type: Device type used to build the mesh when it does not exist yet. Defaults to `None`.

        Raises:
            ValueError: The mesh is not built and ``device_type`` is `None`.
        """
        mesh = getattr(self, "_device_mesh", None)
        if mesh is None:
            if device_type is None:
                raise ValueError("the device mesh is not built yet; pass device_type to get_device_mesh")
            mesh = self.build_device_mesh(device_type)
        return mesh

    @property
    def dp_enabled(self) -> bool:
        """Whether data parallelism is active (``dp_replicate_size`` or ``dp_shard_size`` above 1)."""
        return self.dp_replicate_size > 1 or self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether ``dp_replicate_size`` is above 1."""
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether ``dp_shard_size`` is above 1."""
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        """Whether ``tp_size`` is above 1."""
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        """Whether ``cp_size`` is above 1."""
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        """Whether ``sp_size`` is above 1."""
        return self.sp_size > 1  # type: ignore[operator]

    @property
    def ep_enabled(self) -> bool:
        """Whether ``ep_size`` is above 1."""
        return self.ep_size > 1  # type: ignore[operator]

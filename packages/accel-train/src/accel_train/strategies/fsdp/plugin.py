"""``FullyShardedDataParallelPlugin``: the settings of FSDP 1 and 2, from code or the launcher."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from accel_state.enums import FSDPAutoWrapPolicy, FSDPBackwardPrefetch, FSDPShardingStrategy, FSDPStateDictType
from accel_train.plugin_env import env_value, fill_from_env

__all__ = ["FullyShardedDataParallelPlugin", "setting_name"]

_NAME = "FullyShardedDataParallelPlugin"
logger = logging.getLogger(__name__)

_PRECISION_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "no": "float32", "fp8": "bfloat16"}


def setting_name(value: Any) -> str | None:
    """The documented name of a choice field held as torch's enum, our enum or a string
    (``ShardingStrategy._HYBRID_SHARD_ZERO2`` -> ``"HYBRID_SHARD_ZERO2"``); ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        return value.name.lstrip("_")
    return str(value)


def _torch_choice(field: str, name: str | None) -> Any:
    """torch's FSDP enum member for a parsed choice name (``NO_PREFETCH`` is torch's ``None``)."""
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType

    if name is None:
        return None
    if field == "sharding_strategy":
        return ShardingStrategy[name if name in ShardingStrategy.__members__ else f"_{name}"]
    if field == "backward_prefetch":
        return None if name == "NO_PREFETCH" else BackwardPrefetch[name]
    return StateDictType[name]


def _parse(enum_type: Any, field: str, value: Any) -> Any:
    """A string or number as the enum's value; other objects (torch's own enums, callables) pass."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return str(enum_type.parse(value))
        except ValueError:
            raise ValueError(f"{_NAME}.{field}={value!r} is not valid; choose one of {enum_type.list()}") from None
    return value


@dataclass
class FullyShardedDataParallelPlugin:
    """Settings of Fully Sharded Data Parallel (FSDP 1 or 2).

    Every field left ``None`` takes the value the launcher wrote (``FSDP_*`` variables), else the
    documented default. Choice fields accept the names of `accel_state.enums` (any case) or
    their 1-based numbers.

    ``mixed_precision_policy`` takes torch's object of the version (``MixedPrecision`` for FSDP1,
    ``MixedPrecisionPolicy`` for FSDP2), a dict of dtypes (``{"param_dtype": "bf16", ...}``) or one
    dtype name; left ``None``, it follows the Accelerator's ``mixed_precision``. ``cpu_offload`` takes
    a bool or torch's object of the version; on a machine without an accelerator the parameters already
    live on the CPU, so offloading is skipped with a warning. ``ignored_modules`` takes modules or a
    regular expression over submodule names. ``auto_wrap_policy`` left ``None`` becomes
    TRANSFORMER_BASED_WRAP when ``transformer_cls_names_to_wrap`` is given in code, SIZE_BASED_WRAP when
    ``min_num_params`` is.

    Args:
        fsdp_version: FSDP version, `1` (``FullyShardedDataParallel``) or `2` (``fully_shard``).
            Defaults to `None` (launcher value, else `1`).
        sharding_strategy: FSDP1 only: how parameters, gradients and optimizer states are sharded (`FULL_SHARD`,
            `SHARD_GRAD_OP`, `NO_SHARD`, `HYBRID_SHARD`, `HYBRID_SHARD_ZERO2`). Defaults to `None`
            (launcher value, else `FULL_SHARD`).
        reshard_after_forward: FSDP2 only: whether parameters are freed again after the forward pass.
            Defaults to `None` (launcher value, else `True`).
        backward_prefetch: FSDP1 only: when the next parameters are all-gathered in the backward pass
            (`BACKWARD_PRE`, `BACKWARD_POST`, `NO_PREFETCH`); ignored with a warning under FSDP2.
            Defaults to `None` (launcher value, else no prefetch).
        mixed_precision_policy: Dtypes of parameters, reductions and buffers (see above). Defaults to `None`.
        auto_wrap_policy: Which submodules become their own FSDP unit: `TRANSFORMER_BASED_WRAP`, `SIZE_BASED_WRAP`,
            `NO_WRAP` or a callable. Defaults to `None` (launcher value, else chosen as described above).
        cpu_offload: Whether parameters (and their gradients) are offloaded to the CPU; a bool or torch's object.
            Defaults to `None` (launcher value, else `False`).
        ignored_modules: Modules, or a regular expression over submodule names, that FSDP leaves unsharded.
            Defaults to `None`.
        state_dict_type: How state dicts are gathered and saved: `FULL_STATE_DICT`, `LOCAL_STATE_DICT` or
            `SHARDED_STATE_DICT`. Defaults to `None` (launcher value, else `FULL_STATE_DICT` for FSDP1 and
            `SHARDED_STATE_DICT` for FSDP2).
        state_dict_config: torch's state-dict config matching ``state_dict_type``; `None` builds the usual one.
            Defaults to `None`.
        optim_state_dict_config: torch's optimizer state-dict config matching ``state_dict_type``; `None` builds
            the usual one. Defaults to `None`.
        limit_all_gathers: FSDP1 only: whether the CPU thread is throttled to bound in-flight all-gathers.
            Defaults to `True`.
        use_orig_params: FSDP1 only: whether the original parameters stay visible (needed for per-parameter
            optimizer groups and ``torch.compile``); FSDP2 always keeps them. Defaults to `None`
            (launcher value, else `True`).
        param_init_fn: Callable that materialises modules created on the meta device. Defaults to `None`.
        sync_module_states: Whether rank 0's weights are broadcast to the other ranks at wrapping.
            Defaults to `None` (launcher value, else `True`).
        forward_prefetch: FSDP1 only: whether the next all-gather is issued before the current forward finishes.
            Defaults to `None` (launcher value, else `False`).
        activation_checkpointing: Whether the wrapped layers recompute activations in the backward pass.
            Defaults to `None` (launcher value, else `False`).
        activation_checkpointing_offload: Whether checkpointed activations are offloaded to the CPU.
            Defaults to `None` (launcher value, else `False`).
        cpu_ram_efficient_loading: Whether only rank 0 loads the full weights, the others starting empty; needs
            ``sync_module_states``. Defaults to `None` (launcher value, else `False`).
        transformer_cls_names_to_wrap: Names of the layer classes wrapped under `TRANSFORMER_BASED_WRAP`, as a
            list or a comma-separated string. Defaults to `None` (launcher value, else the model's own
            ``_no_split_modules``).
        min_num_params: Smallest parameter count of a unit under `SIZE_BASED_WRAP`. Defaults to `None`
            (launcher value, else `100_000_000` with that policy).
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Any = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        fill_from_env(self, {"fsdp_version": ("FSDP_VERSION", 1)})
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"{_NAME}.fsdp_version={self.fsdp_version!r} is not valid; choose one of [1, 2]")
        version = self.fsdp_version
        self._check_version_only_fields(version)
        explicit_wrap = (self.transformer_cls_names_to_wrap, self.min_num_params)
        if version == 2 and self.sharding_strategy is not None:
            raise ValueError(f"{_NAME}: sharding_strategy is FSDP1 only; with fsdp_version=2 use reshard_after_forward")
        if version == 1 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"{_NAME}: reshard_after_forward is FSDP2 only; with fsdp_version=1 use sharding_strategy")
        if version == 1:
            fill_from_env(self, {"sharding_strategy": ("FSDP_SHARDING_STRATEGY", "FULL_SHARD")})
            self.sharding_strategy = _torch_choice(
                "sharding_strategy",
                setting_name(_parse(FSDPShardingStrategy, "sharding_strategy", self.sharding_strategy)),
            )
        elif self.reshard_after_forward is None:
            raw = env_value("FSDP_RESHARD_AFTER_FORWARD", "true")
            self.reshard_after_forward = str(raw).strip().lower() in ("1", "true", "yes", "y", "on")
        fill_from_env(
            self,
            {
                "backward_prefetch": ("FSDP_BACKWARD_PREFETCH", None),
                "auto_wrap_policy": ("FSDP_AUTO_WRAP_POLICY", None),
                "state_dict_type": (
                    "FSDP_STATE_DICT_TYPE",
                    "FULL_STATE_DICT" if version == 1 else "SHARDED_STATE_DICT",
                ),
                "use_orig_params": ("FSDP_USE_ORIG_PARAMS", True),
                "sync_module_states": ("FSDP_SYNC_MODULE_STATES", True),
                "forward_prefetch": ("FSDP_FORWARD_PREFETCH", False),
                "activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", False),
                "activation_checkpointing_offload": ("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", False),
                "ignored_modules": ("FSDP_IGNORED_MODULES", None),
                "cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", False),
                "transformer_cls_names_to_wrap": ("FSDP_TRANSFORMER_CLS_TO_WRAP", None),
                "min_num_params": ("FSDP_MIN_NUM_PARAMS", None),
            },
        )
        if self.cpu_offload is None:
            self.cpu_offload = env_value("FSDP_OFFLOAD_PARAMS", None)
            if self.cpu_offload is None:
                self.cpu_offload = env_value("FSDP_CPU_OFFLOAD", False)
        prefetch = setting_name(_parse(FSDPBackwardPrefetch, "backward_prefetch", self.backward_prefetch))
        if version == 2 and prefetch not in (None, "NO_PREFETCH"):
            # As the documented system: FSDP2 prefetches by itself, so the setting is dropped with a warning.
            logger.warning(
                "%s: backward_prefetch=%s is FSDP1 only (FSDP2 prefetches by itself); ignored", _NAME, prefetch
            )
            prefetch = None
        self.backward_prefetch = _torch_choice("backward_prefetch", prefetch)
        self.set_state_dict_type(self.state_dict_type)
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = _parse(FSDPAutoWrapPolicy, "auto_wrap_policy", self.auto_wrap_policy.upper())
        if self.min_num_params is not None and self.min_num_params < 0:
            raise ValueError(f"{_NAME}.min_num_params must be >= 0, got {self.min_num_params}")
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [
                n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()
            ]
        if self.auto_wrap_policy is None:
            # Layer classes or a size given in code choose their policy.
            if explicit_wrap[0]:
                self.auto_wrap_policy = "TRANSFORMER_BASED_WRAP"
            elif explicit_wrap[1]:
                self.auto_wrap_policy = "SIZE_BASED_WRAP"
        if self.auto_wrap_policy == "SIZE_BASED_WRAP" and self.min_num_params is None:
            self.min_num_params = 100_000_000
        self.validate_mixed_precision_policy()
        self.set_cpu_offload()
        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            raise ValueError(
                f"{_NAME}: cpu_ram_efficient_loading=True needs sync_module_states=True (ranks other than 0 start "
                "empty and receive rank 0's weights); set sync_module_states=True (Set the `sync_module_states` "
                "flag to `True` so that model states are synced across processes when initializing FSDP object)"
            )

    def _check_version_only_fields(self, version: int) -> None:
        """Options of one FSDP version given with the other: an error naming both."""
        policy, offload = self.mixed_precision_policy, self.cpu_offload
        policy_kind = type(policy).__name__ if policy is not None else None
        offload_kind = type(offload).__name__ if offload is not None else None
        if version == 1:
            if policy_kind == "MixedPrecisionPolicy":
                raise ValueError(
                    f"{_NAME}: mixed_precision_policy is an FSDP2 MixedPrecisionPolicy but fsdp_version=1; give a "
                    "torch.distributed.fsdp.MixedPrecision (or set fsdp_version=2)"
                )
            if offload_kind in ("CPUOffloadPolicy", "OffloadPolicy"):
                raise ValueError(
                    f"{_NAME}: cpu_offload={offload_kind} is FSDP2 only; with fsdp_version=1 give "
                    "CPUOffload(offload_params=True) or True"
                )
            return
        if policy_kind == "MixedPrecision":
            raise ValueError(
                f"{_NAME}: mixed_precision_policy is an FSDP1 MixedPrecision but fsdp_version=2; give a "
                "torch.distributed.fsdp.MixedPrecisionPolicy (or set fsdp_version=1)"
            )
        if offload_kind == "CPUOffload":
            raise ValueError(
                f"{_NAME}: cpu_offload=CPUOffload is FSDP1 only; with fsdp_version=2 give CPUOffloadPolicy() or True"
            )
        if self.use_orig_params is False:
            raise ValueError(
                f"{_NAME}: use_orig_params=False is FSDP1 only (FSDP2 always trains the original parameters); "
                "remove it or set fsdp_version=1"
            )

    # -- the documented methods --------------------------------------------------------------------

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set how the model's state dict is taken and saved, with torch's matching configs.

        ``save_state`` writes sharded files for ``SHARDED_STATE_DICT`` (and ``LOCAL_STATE_DICT``, FSDP1)
        and one full file for ``FULL_STATE_DICT``; call it with ``"FULL_STATE_DICT"`` after training
        sharded to save the final model whole.

        Args:
            state_dict_type: a name of `accel_state.enums.FSDPStateDictType` (any case, or its
                1-based number) or torch's ``StateDictType``; ``None`` takes ``FSDP_STATE_DICT_TYPE``, else
                ``FULL_STATE_DICT`` for FSDP1 and ``SHARDED_STATE_DICT`` for FSDP2.

        Raises:
            ValueError: an unknown name, or ``LOCAL_STATE_DICT`` with FSDP2.
        """
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
        )

        if state_dict_type is None:
            default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
            state_dict_type = env_value("FSDP_STATE_DICT_TYPE", default)
        name = setting_name(_parse(FSDPStateDictType, "state_dict_type", state_dict_type))
        if self.fsdp_version == 2 and name == "LOCAL_STATE_DICT":
            raise ValueError(
                f"{_NAME}: state_dict_type=LOCAL_STATE_DICT is FSDP1 only; use SHARDED_STATE_DICT (FSDP2 does not "
                "support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or "
                "`FULL_STATE_DICT`.)"
            )
        self.state_dict_type = _torch_choice("state_dict_type", name)
        if name == "FULL_STATE_DICT":
            if self.state_dict_config is None or isinstance(self.state_dict_config, ShardedStateDictConfig):
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None or isinstance(
                self.optim_state_dict_config, ShardedOptimStateDictConfig
            ):
                self.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
        elif name == "SHARDED_STATE_DICT":
            if self.state_dict_config is None or isinstance(self.state_dict_config, FullStateDictConfig):
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None or isinstance(
                self.optim_state_dict_config, FullOptimStateDictConfig
            ):
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)

    def set_auto_wrap_policy(self, model: Any) -> None:
        """Turn the named wrap policy into torch's callable for ``model``.

        Args:
            model: the model to wrap; ``TRANSFORMER_BASED_WRAP`` resolves ``transformer_cls_names_to_wrap``
                (else the model's ``_no_split_modules``) against its submodule classes.

        Raises:
            ValueError: a class name that is not a submodule class of ``model`` (the error lists those
                it has).
        """
        from accel_train.strategies.fsdp.wrap import fsdp1_auto_wrap_policy

        if self.auto_wrap_policy is None or (
            callable(self.auto_wrap_policy) and not isinstance(self.auto_wrap_policy, str)
        ):
            return
        self.auto_wrap_policy = fsdp1_auto_wrap_policy(model, self)

    def set_mixed_precision(self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False) -> None:
        """Build the mixed-precision policy of torch's FSDP version from one mode or dtype: parameters,
        reductions and buffers (FSDP1) or outputs (FSDP2) all in that dtype.

        Args:
            mixed_precision: ``"fp16"``, ``"bf16"``, ``"fp32"``/``"no"`` or a ``torch.dtype``.
            buffer_autocast: FSDP1 only: keep buffers in float32 instead of casting them too.
            override: replace a policy already set (by default an existing policy wins).

        Raises:
            ValueError: an unknown mode.
        """
        import torch
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        if isinstance(mixed_precision, torch.dtype):
            dtype = mixed_precision
        else:
            key = str(mixed_precision).lower()
            if key not in _PRECISION_DTYPES:
                raise ValueError(
                    f"{_NAME}.set_mixed_precision({mixed_precision!r}): unknown mode; choose one of "
                    f"{sorted(_PRECISION_DTYPES)} or a torch.dtype"
                )
            dtype = getattr(torch, _PRECISION_DTYPES[key])
        if self.mixed_precision_policy is not None and not override:
            return
        if self.fsdp_version == 1:
            buffer = torch.float32 if buffer_autocast else dtype
            self.mixed_precision_policy = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=buffer)
        else:
            self.mixed_precision_policy = MixedPrecisionPolicy(
                param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype
            )

    def validate_mixed_precision_policy(self) -> None:
        """Turn a dict or dtype name given as ``mixed_precision_policy`` into torch's object of the
        FSDP version (``MixedPrecision`` for 1, ``MixedPrecisionPolicy`` for 2).

        Raises:
            ValueError: a policy of the other version, an unknown key or dtype name.
            TypeError: anything else.
        """
        from accel_train.strategies.fsdp.wrap import fsdp1_mixed_precision, fsdp2_mixed_precision_policy

        if self.mixed_precision_policy is None:
            return
        build = fsdp1_mixed_precision if self.fsdp_version == 1 else fsdp2_mixed_precision_policy
        self.mixed_precision_policy = build(self.mixed_precision_policy, (None, None, None))

    def set_cpu_offload(self) -> None:
        """Turn a bool ``cpu_offload`` into torch's object of the FSDP version (``CPUOffload`` for 1,
        ``CPUOffloadPolicy``/``OffloadPolicy`` for 2); torch's objects are kept."""
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        offload = self.cpu_offload
        if isinstance(offload, (CPUOffload, OffloadPolicy)):
            self.validate_cpu_offload()
            return
        wanted = (
            str(offload).strip().lower() in ("1", "true", "yes", "y", "on")
            if isinstance(offload, str)
            else bool(offload)
        )
        if self.fsdp_version == 1:
            self.cpu_offload = CPUOffload(offload_params=wanted)
        else:
            self.cpu_offload = CPUOffloadPolicy() if wanted else OffloadPolicy()

    def validate_cpu_offload(self) -> None:
        """Check that ``cpu_offload`` is torch's object of the FSDP version.

        Raises:
            ValueError: ``CPUOffload`` with FSDP2 or an ``OffloadPolicy`` with FSDP1, or another type.
        """
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        want = CPUOffload if self.fsdp_version == 1 else OffloadPolicy
        if not isinstance(self.cpu_offload, want):
            raise ValueError(
                f"{_NAME}.cpu_offload={self.cpu_offload!r} does not fit fsdp_version={self.fsdp_version}; give "
                f"{'CPUOffload(offload_params=...)' if self.fsdp_version == 1 else 'CPUOffloadPolicy() or OffloadPolicy()'}"
                " or a bool"
                f" (`cpu_offload` must be an instance of `torch.distributed.fsdp.{want.__name__}` in "
                f"FSDP{self.fsdp_version}, got {self.cpu_offload})"
            )

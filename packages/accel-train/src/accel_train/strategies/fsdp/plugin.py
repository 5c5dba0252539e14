"""``FullyShardedDataParallelPlugin``: the settings of FSDP 1 and 2, from code or the launcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_state.enums import FSDPAutoWrapPolicy, FSDPBackwardPrefetch, FSDPShardingStrategy, FSDPStateDictType
from accel_train.plugin_env import env_value, fill_from_env

__all__ = ["FullyShardedDataParallelPlugin"]

_NAME = "FullyShardedDataParallelPlugin"


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
    documented default. Choice fields accept the names of :mod:`accel_state.enums` (any case) or
    their 1-based numbers.

    ``mixed_precision_policy`` takes torch's object of the version (``MixedPrecision`` for FSDP1,
    ``MixedPrecisionPolicy`` for FSDP2), a dict of dtypes (``{"param_dtype": "bf16", ...}``) or one
    dtype name; left ``None``, it follows the Accelerator's ``mixed_precision``. ``cpu_offload`` takes
    a bool or torch's object of the version; on a machine without an accelerator the parameters already
    live on the CPU, so offloading is skipped with a warning. ``ignored_modules`` takes modules or a
    regular expression over submodule names. ``auto_wrap_policy`` left ``None`` becomes
    TRANSFORMER_BASED_WRAP when ``transformer_cls_names_to_wrap`` is given in code, SIZE_BASED_WRAP when
    ``min_num_params`` is.
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
            self.sharding_strategy = _parse(FSDPShardingStrategy, "sharding_strategy", self.sharding_strategy)
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
        self.backward_prefetch = _parse(FSDPBackwardPrefetch, "backward_prefetch", self.backward_prefetch)
        if version == 2 and self.backward_prefetch not in (None, "NO_PREFETCH"):
            raise ValueError(f"{_NAME}: backward_prefetch is FSDP1 only (FSDP2 prefetches by itself); remove it")
        self.state_dict_type = _parse(FSDPStateDictType, "state_dict_type", self.state_dict_type)
        if version == 2 and self.state_dict_type == "LOCAL_STATE_DICT":
            raise ValueError(f"{_NAME}: state_dict_type=LOCAL_STATE_DICT is FSDP1 only; use SHARDED_STATE_DICT")
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
        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            raise ValueError(
                f"{_NAME}: cpu_ram_efficient_loading=True needs sync_module_states=True (ranks other than 0 start "
                "empty and receive rank 0's weights); set sync_module_states=True"
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

"""``DeepSpeedPlugin``: the settings of DeepSpeed, from code, a DeepSpeed config or the launcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_state.enums import ZERO_STAGES, MSAMPOptLevel, OffloadDevice
from accel_train.plugin_env import env_value, fill_from_env

__all__ = ["DeepSpeedPlugin"]

_NAME = "DeepSpeedPlugin"


def _check(name: str, value: Any, choices: list[Any] | tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{_NAME}.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class DeepSpeedPlugin:
    """Settings of DeepSpeed (ZeRO stage, offload, a JSON config file or dict).

    Fields left ``None`` take the values the launcher wrote (``ACCELERATE_DEEPSPEED_*``); without a
    config file, unset ones get the documented defaults (ZeRO-2, no offload).
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        fill_from_env(
            self,
            {
                "hf_ds_config": ("ACCELERATE_DEEPSPEED_CONFIG_FILE", None),
                "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", None),
                "gradient_clipping": ("ACCELERATE_GRADIENT_CLIPPING", None),
                "transformer_moe_cls_names": ("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", None),
            },
        )
        if isinstance(self.transformer_moe_cls_names, list):
            self.transformer_moe_cls_names = ",".join(self.transformer_moe_cls_names)
        # Without a config file the plugin is the configuration: documented defaults fill the gaps.
        with_file = self.hf_ds_config is not None
        fill_from_env(
            self,
            {
                "zero_stage": ("ACCELERATE_DEEPSPEED_ZERO_STAGE", None if with_file else 2),
                "offload_optimizer_device": (
                    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                    None if with_file else "none",
                ),
                "offload_param_device": ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", None if with_file else "none"),
                "offload_optimizer_nvme_path": (
                    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
                    None if with_file else "none",
                ),
                "offload_param_nvme_path": (
                    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
                    None if with_file else "none",
                ),
                "zero3_save_16bit_model": ("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", None if with_file else False),
            },
        )
        if self.zero3_init_flag is None:
            self.zero3_init_flag = env_value("ACCELERATE_DEEPSPEED_ZERO3_INIT", None)
        _check("zero_stage", self.zero_stage, ZERO_STAGES)
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, value.lower())
            _check(name, getattr(self, name), OffloadDevice.list())
        _check("msamp_opt_level", self.msamp_opt_level, MSAMPOptLevel.list())
        if self.zero3_init_flag and self.zero_stage not in (None, 3):
            raise ValueError(f"{_NAME}.zero3_init_flag needs zero_stage=3, got zero_stage={self.zero_stage}")
        if (
            self.hf_ds_config is not None
            and not isinstance(self.hf_ds_config, (str, dict))
            and not hasattr(self.hf_ds_config, "config")
        ):
            raise TypeError(
                f"{_NAME}.hf_ds_config must be a path to a JSON file or a dict, got {type(self.hf_ds_config)}"
            )
        self.selected = False

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this plugin the active one (with several plugins)."""
        self.selected = True

    def _unselect(self) -> None:
        self.selected = False

"""``DeepSpeedPlugin``: the settings of DeepSpeed, from code, a DeepSpeed config or the launcher."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from accel_state.enums import ZERO_STAGES, MSAMPOptLevel, OffloadDevice
from accel_train.plugin_env import env_value, fill_from_env
from accel_train.strategies.deepspeed import config as dsc

__all__ = ["DeepSpeedPlugin"]

logger = logging.getLogger(__name__)

_NAME = "DeepSpeedPlugin"


def _check(name: str, value: Any, choices: list[Any] | tuple[Any, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{_NAME}.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class DeepSpeedPlugin:
    """Settings of DeepSpeed (ZeRO stage, offload, a JSON config file or dict).

    Fields left ``None`` take the values the launcher wrote (``ACCELERATE_DEEPSPEED_*``). Without a
    config file the fields *are* the configuration (documented defaults: ZeRO-2, no offload). With
    ``hf_ds_config`` (a JSON path, a dict or an `HfDeepSpeedConfig`)
    the file is the configuration and the fields only fill its ``"auto"`` values; the rest of the
    ``"auto"`` values are filled by ``prepare``. The finished dict is `deepspeed_config`.

    Args:
        hf_ds_config: DeepSpeed config as a JSON file path, a dict or an ``HfDeepSpeedConfig``; `None` builds the
            config from the fields below. Defaults to `None` (launcher value).
        gradient_accumulation_steps: Number of steps gradients are accumulated over before an optimizer step.
            Defaults to `None` (launcher value, else the Accelerator's).
        gradient_clipping: Maximum gradient norm DeepSpeed clips to. Defaults to `None` (launcher value).
        zero_stage: ZeRO stage, `0`, `1`, `2` or `3` (also as a string: `"2"` or `"zero2"`, stored as the
            number). Defaults to `None` (launcher value, else `2` without a config file).
        is_train_batch_min: Whether, when several dataloaders are prepared, the smallest of their batch sizes gives
            ``train_batch_size`` (else the largest). Defaults to `True`.
        offload_optimizer_device: Where optimizer states are offloaded: `none`, `cpu` or `nvme` (ZeRO 2 and 3).
            Defaults to `None` (launcher value, else `none`).
        offload_param_device: Where parameters are offloaded: `none`, `cpu` or `nvme` (ZeRO 3 only).
            Defaults to `None` (launcher value, else `none`).
        offload_optimizer_nvme_path: NVMe folder used when optimizer states go to `nvme`. Defaults to `None`
            (launcher value, else `none`).
        offload_param_nvme_path: NVMe folder used when parameters go to `nvme`. Defaults to `None`
            (launcher value, else `none`).
        zero3_init_flag: Whether models are built already partitioned under ``deepspeed.zero.Init`` (ZeRO 3 only;
            turned off with a warning otherwise). Defaults to `None` (launcher value, else on with ZeRO 3).
        zero3_save_16bit_model: Whether a ZeRO-3 model is saved gathered as 16-bit weights. Defaults to `None`
            (launcher value, else `False`).
        transformer_moe_cls_names: Comma-separated names (or a list) of the MoE layer classes marked as ZeRO-3 leaf
            modules. Defaults to `None` (launcher value).
        enable_msamp: Whether MS-AMP FP8 training is switched on in the config. Defaults to `None`.
        msamp_opt_level: MS-AMP optimisation level, `O1` or `O2`, used with ``enable_msamp``. Defaults to `None`
            (`O1`).
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
        from accel_train.strategies.deepspeed.utils import HfDeepSpeedConfig

        fill_from_env(
            self,
            {
                "hf_ds_config": ("ACCELERATE_DEEPSPEED_CONFIG_FILE", None),
                "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", None),
                "gradient_clipping": ("ACCELERATE_GRADIENT_CLIPPING", None),
                "transformer_moe_cls_names": ("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", None),
            },
        )
        if self.hf_ds_config in ("none", ""):
            self.hf_ds_config = None
        given_in_code = {name for name in dsc.PLUGIN_TO_CONFIG if getattr(self, name) is not None}
        if isinstance(self.transformer_moe_cls_names, list):
            self.transformer_moe_cls_names = ",".join(self.transformer_moe_cls_names)
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
        self.zero_stage = dsc.zero_stage_number(self.zero_stage, ZERO_STAGES)
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, value.lower())
            _check(name, getattr(self, name), OffloadDevice.list())
        _check("msamp_opt_level", self.msamp_opt_level, MSAMPOptLevel.list())
        if (
            self.hf_ds_config is not None
            and not isinstance(self.hf_ds_config, (str, dict))
            and not hasattr(self.hf_ds_config, "config")
        ):
            raise TypeError(
                f"{_NAME}.hf_ds_config must be a path to a JSON file or a dict, got {type(self.hf_ds_config)}"
            )
        if with_file:
            dsc.check_config_file_fields(env_value("ACCELERATE_CONFIG_DS_FIELDS", None))
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
            config = self.hf_ds_config.config
            if "zero_optimization" not in config:
                raise ValueError(
                    f"the DeepSpeed config {self._source()} has no `zero_optimization` section; add one "
                    '(e.g. {"zero_optimization": {"stage": 2}}). '
                    "Please specify the ZeRO optimization config in the DeepSpeed config."
                )
            config.setdefault("gradient_accumulation_steps", 1)
            # The plugin's fields (from code or the launcher) resolve the file's "auto" values; a value
            # given on purpose (in code, or a launcher flag other than its default) that contradicts a
            # concrete value of the file is an error rather than silently ignored.
            explicit = {
                name: value
                for name, value in self._field_values(by_field=True).items()
                if name in given_in_code or _launcher_explicit(name, value)
            }
            conflicts = dsc.fill_auto(
                config, {dsc.PLUGIN_TO_CONFIG[name]: value for name, value in explicit.items()}, must_match=True
            )
            if conflicts:
                raise ValueError(
                    f"the DeepSpeed config {self._source()} contradicts settings given to the plugin or as "
                    "`accel launch` flags:\n  - " + "\n  - ".join(conflicts) + "\nGive each setting once: set it "
                    'to "auto" in the JSON file to take the flag, or drop the flag / plugin argument.'
                )
            dsc.fill_auto(config, self._field_values())
            self.hf_ds_config.set_stage_and_offload()  # the stage is known now that "auto" is filled
            stage = config["zero_optimization"].get("stage")
            if isinstance(stage, int) and not isinstance(stage, bool):
                self.zero_stage = stage  # the field answers from the resolved config, as documented
        else:
            self.hf_ds_config = HfDeepSpeedConfig(
                dsc.config_from_fields(
                    zero_stage=self.zero_stage if self.zero_stage is not None else 2,
                    gradient_accumulation_steps=self.gradient_accumulation_steps,
                    gradient_clipping=self.gradient_clipping,
                    offload_optimizer_device=self.offload_optimizer_device,
                    offload_param_device=self.offload_param_device,
                    offload_optimizer_nvme_path=self.offload_optimizer_nvme_path,
                    offload_param_nvme_path=self.offload_param_nvme_path,
                    zero3_save_16bit_model=bool(self.zero3_save_16bit_model),
                )
            )
        #: The DeepSpeed config dict (the one the engine receives; prepare fills its "auto" values).
        self.deepspeed_config: dict[str, Any] = self.hf_ds_config.config
        self.deepspeed_config["steps_per_print"] = float("inf")  # DeepSpeed prints nothing on its own
        if self.zero3_init_flag is None:
            self.zero3_init_flag = env_value("ACCELERATE_DEEPSPEED_ZERO3_INIT", None)
        if self.zero3_init_flag is None:
            self.zero3_init_flag = self.hf_ds_config.is_zero3()
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            stage = self.hf_ds_config.get_value("zero_optimization.stage")
            # One rule for code and the launcher (the documented ZeRO-2 launch example sets it): not
            # applicable, so off with a warning, as the documented system does.
            logger.warning("zero3_init_flag applies to ZeRO stage 3 only (stage is %s); it is turned off", stage)
            self.zero3_init_flag = False
        if self.enable_msamp and "msamp" not in self.deepspeed_config:
            self.deepspeed_config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level or "O1"}
        self.selected = False
        self._dschf: Any = None

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built partitioned under ``deepspeed.zero.Init`` (ZeRO-3 with
        ``zero3_init_flag``); a config left ``"auto"`` until ``prepare`` answers from its stage then."""
        return bool(self.zero3_init_flag) and self.hf_ds_config.is_zero3()

    # -- reading the config ---------------------------------------------------------------------------

    def _source(self) -> str:
        return "given as a dict" if not isinstance(self.hf_ds_config, str) else self.hf_ds_config

    def _field_values(self, by_field: bool = False) -> dict[str, Any]:
        """Config key (or field name) -> value of every field that is set."""
        return {
            (name if by_field else key): getattr(self, name)
            for name, key in dsc.PLUGIN_TO_CONFIG.items()
            if getattr(self, name) is not None
        }

    @property
    def config(self) -> dict[str, Any]:
        """The DeepSpeed config dict (the same object as `deepspeed_config`)."""
        return self.deepspeed_config

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config value at dotted ``ds_key_long``.

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
            default: Value returned when the key is absent. Defaults to `None`.
        """
        return dsc.get_value(self.deepspeed_config, ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """True when the config value at dotted ``ds_key_long`` is still ``"auto"``.

        Args:
            ds_key_long: Dotted path of the key, e.g. `train_micro_batch_size_per_gpu`.
        """
        return dsc.is_auto(self.deepspeed_config, ds_key_long)

    def fill_match(
        self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Fill ``"auto"`` at ``ds_key_long`` with ``kwargs[ds_key_long]``; with ``must_match``, a
        different concrete value is appended to ``mismatches``.

        Args:
            ds_key_long: Dotted path of the key to fill; nothing happens when it is not in ``kwargs``.
            mismatches: List the contradictions found are appended to; `None` drops them. Defaults to `None`.
            must_match: Whether a concrete value different from the run's counts as a contradiction.
                Defaults to `True`.
            **kwargs: The run's values, by dotted key.

        Raises:
            ValueError: ``ds_key_long`` is ``"auto"`` in the config and not in ``kwargs`` (as documented:
                an ``"auto"`` needs a value).
        """
        if ds_key_long not in kwargs:
            if dsc.is_auto(self.deepspeed_config, ds_key_long):
                raise dsc.missing_auto_error([ds_key_long])
            return
        found = dsc.fill_auto(self.deepspeed_config, {ds_key_long: kwargs[ds_key_long]}, must_match=must_match)
        if mismatches is not None:
            mismatches.extend(found)

    def deepspeed_config_process(
        self, prefix: str = "", mismatches: Any = None, config: Any = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Fill every ``"auto"`` of the config from ``kwargs`` (dotted keys); an ``"auto"`` that
        ``kwargs`` does not give is an error naming all of them (as documented), and, with ``must_match``,
        so is a concrete value that differs from the run's (listing all of them).

        Args:
            prefix: Accepted for compatibility; the keys of ``kwargs`` are already full dotted paths.
                Defaults to `""`.
            mismatches: List the contradictions are appended to instead of raising; `None` raises.
                Defaults to `None`.
            config: Accepted for compatibility; the plugin's own config is filled. Defaults to `None`.
            must_match: Whether a concrete value different from the run's counts as a contradiction.
                Defaults to `True`.
            **kwargs: The run's values, by dotted key.

        Raises:
            ValueError: ``"auto"`` values were left without a value in ``kwargs``; or contradictions were
                found and ``mismatches`` is `None`.
        """
        found = dsc.fill_auto(self.deepspeed_config, kwargs, must_match=must_match)
        left = list(dsc.auto_keys(self.deepspeed_config))
        if left:
            raise dsc.missing_auto_error(left)
        if mismatches is not None:
            mismatches.extend(found)
        elif found:
            raise ValueError(
                "the DeepSpeed config contradicts the run's settings (Please correct the following DeepSpeed "
                "config values that mismatch kwargs values):\n  - "
                + "\n  - ".join(found)
                + '\nChange the config value, or set it to "auto" to take the run\'s.'
            )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Make the config's fp16 / bf16 sections follow ``mixed_precision`` (an error when they contradict it).

        Args:
            mixed_precision: The run's mixed-precision mode: `no`, `fp16`, `bf16` or `fp8`.
        """
        dsc.resolve_mixed_precision(self.deepspeed_config, str(mixed_precision))

    # -- ZeRO-3 construction ------------------------------------------------------------------------

    def zero3_init_context_manager(self, enable: bool = False) -> contextlib.AbstractContextManager[Any]:
        """``deepspeed.zero.Init`` over this config when ``enable`` and ZeRO-3 (else a no-op context):
        modules built inside are created partitioned over the processes.

        Args:
            enable: Whether to partition at construction; `False` gives a context that does nothing.
                Defaults to `False`.
        """
        if not enable or not self.hf_ds_config.is_zero3():
            return contextlib.nullcontext()
        from accel_train.strategies.deepspeed.utils import import_deepspeed

        deepspeed = import_deepspeed()
        return deepspeed.zero.Init(config_dict_or_path=_init_config(self.deepspeed_config))  # type: ignore[no-any-return]

    def set_deepspeed_weakref(self) -> None:
        """Register this config with Transformers when the script uses it (``transformers`` imported),
        so that ``from_pretrained`` builds models under ``deepspeed.zero.Init`` while ZeRO-3 init is on.

        accel does not depend on Transformers: a script that never imported it has nothing to register.
        Transformers' own ``HfDeepSpeedConfig`` is built only when it can be (it needs the ``accelerate``
        package, real or provided by ``ACCEL_PROVIDE_ACCELERATE``); otherwise accel registers its own
        config object, which answers the two questions Transformers asks (``is_zero3()``, ``config``).
        Transformers' global state is never left pointing at a half-built object.
        """
        import importlib
        import sys

        if "transformers" not in sys.modules:
            return
        try:
            integration = importlib.import_module("transformers.integrations.deepspeed")
        except ImportError:  # pragma: no cover - a Transformers without the integration
            return
        config = _init_config(self.deepspeed_config)
        if getattr(integration, "DeepSpeedConfig", object) is not object:
            try:
                self._dschf = integration.HfDeepSpeedConfig(config)
                return
            except Exception as error:  # its version checks: fall back to accel's object below
                logger.info(
                    "transformers' HfDeepSpeedConfig could not be built (%s); accel's config is registered", error
                )
        from accel_train.strategies.deepspeed.utils import HfDeepSpeedConfig

        self._dschf = HfDeepSpeedConfig(config)
        integration.set_hf_deepspeed_config(self._dschf)

    def set_moe_leaf_modules(self, model: Any) -> None:
        """Mark the MoE layers named in ``transformer_moe_cls_names`` as ZeRO-3 leaf modules.

        Args:
            model: The model whose submodules of those classes are marked.

        Raises:
            ValueError: A named class is not found in the model.
        """
        if not self.transformer_moe_cls_names:
            return
        names = [name.strip() for name in self.transformer_moe_cls_names.split(",") if name.strip()]
        classes = {type(module) for module in model.modules() if type(module).__name__ in names}
        missing = sorted(set(names) - {cls.__name__ for cls in classes})
        if missing:
            raise ValueError(f"transformer_moe_cls_names names classes that are not in the model: {missing}")
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, sorted(classes, key=lambda cls: cls.__name__))

    # -- several plugins ----------------------------------------------------------------------------

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this plugin the active one (with several plugins); use
        ``AcceleratorState().select_deepspeed_plugin(name)`` rather than calling it directly."""
        if not _from_accelerator_state:
            raise ValueError(
                "select a DeepSpeed plugin through the state: `accelerator.state.select_deepspeed_plugin(name)`"
            )
        self.selected = True
        if self.zero3_init_flag:
            self.set_deepspeed_weakref()

    def _unselect(self) -> None:
        self.selected = False
        self._dschf = None


#: Plugin field -> the variable the launcher writes it to.
_FIELD_ENV = {
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
}


def _launcher_explicit(name: str, value: Any) -> bool:
    """True when the launcher wrote a value for field ``name`` that is not its flag's default."""
    from accel_state import env_vars

    variable = _FIELD_ENV[name]
    return env_value(variable, None) is not None and value != env_vars.spec(variable).default


def _init_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` that ``deepspeed.zero.Init`` accepts before prepare filled its ``"auto"``
    values: those are dropped (DeepSpeed's defaults apply while building), batch size 1 stands in."""
    import copy

    ready = copy.deepcopy(config)
    for key in list(dsc.auto_keys(ready)):
        *parents, last = key.split(".")
        node = ready
        for part in parents:
            node = node[part]
        del node[last]
    if "train_micro_batch_size_per_gpu" not in ready and "train_batch_size" not in ready:
        ready["train_micro_batch_size_per_gpu"] = 1
    return ready

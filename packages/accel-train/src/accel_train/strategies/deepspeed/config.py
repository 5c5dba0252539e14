"""The DeepSpeed JSON configuration as data: reading it, filling its ``"auto"`` values, checking it.

Pure logic (no DeepSpeed import, no process group): the plugin and the strategy call these functions
with what they know, and DeepSpeed receives the finished dict. Keys are addressed with dotted paths
(``"zero_optimization.offload_optimizer.device"``).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "ENGINE_DEFAULTS",
    "CONFIG_FILE_COMPANION_FIELDS",
    "HIDDEN_SIZE_KEYS",
    "PLUGIN_TO_CONFIG",
    "auto_keys",
    "check_config_file_fields",
    "config_from_fields",
    "effective_mixed_precision",
    "fill_auto",
    "get_value",
    "hidden_size_of",
    "hidden_size_values",
    "is_auto",
    "load_config",
    "missing_auto_error",
    "micro_batch_size",
    "resolve_batch_sizes",
    "resolve_mixed_precision",
    "scheduler_values",
    "unresolved_error",
    "set_value",
    "zero_stage_number",
]

AUTO = "auto"
_MISSING = object()

#: Plugin field -> the DeepSpeed config key it sets.
PLUGIN_TO_CONFIG: dict[str, str] = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}

#: ``deepspeed_config`` keys of an accel config file that may sit beside ``deepspeed_config_file``
#: (the others are settings the JSON file owns).
CONFIG_FILE_COMPANION_FIELDS = frozenset(
    {
        "deepspeed_config_file",
        "zero3_init_flag",
        "deepspeed_hostfile",
        "deepspeed_inclusion_filter",
        "deepspeed_exclusion_filter",
        "deepspeed_multinode_launcher",
        "deepspeed_moe_layer_cls_names",
    }
)

#: Config keys whose ``"auto"`` value comes from the model's hidden size.
HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


# -- reading and addressing -----------------------------------------------------------------------


def zero_stage_number(value: Any, stages: tuple[int, ...] = (0, 1, 2, 3)) -> int | None:
    """The ZeRO stage ``value`` names, as an int: an int of ``stages``, or the string of one, bare or with
    the ``zero`` prefix (``"2"``, ``"zero2"``, ``"ZeRO2"``); ``None`` stays ``None`` (not given).

    The documented system takes such strings without a check and passes them on to DeepSpeed; accel
    accepts the same spellings, turned into the stage number DeepSpeed's config expects.

    Args:
        value: the ``zero_stage`` given to the plugin (or by the launcher).
        stages: the valid stage numbers.

    Raises:
        ValueError: ``value`` names no stage (named, with the accepted spellings).
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value in stages:
        return value
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("zero").removeprefix("_").removeprefix("-")
        if text.isdigit() and int(text) in stages:
            return int(text)
    raise ValueError(
        f"DeepSpeedPlugin.zero_stage={value!r} is not valid; choose one of {list(stages)} "
        f"(or the same as a string: {', '.join(repr(f'zero{stage}') for stage in stages)})"
    )


def load_config(source: Any) -> dict[str, Any]:
    """A private copy of the config given as a JSON path, a JSON string, a dict, or an object with ``.config``."""
    if hasattr(source, "config") and isinstance(source.config, dict):
        return source.config  # an HfDeepSpeedConfig: its dict is the live config, shared on purpose
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                try:
                    config = json.load(handle)
                except json.JSONDecodeError as error:
                    raise ValueError(f"DeepSpeed config file {path} is not valid JSON: {error}") from None
        else:
            try:
                config = json.loads(path)
            except json.JSONDecodeError:
                raise ValueError(
                    f"DeepSpeed config {path!r} is neither an existing JSON file nor a JSON string"
                ) from None
        if not isinstance(config, dict):
            raise ValueError(f"DeepSpeed config {path!r} must hold a JSON object, got {type(config).__name__}")
        return config
    raise TypeError(f"a DeepSpeed config is a path to a JSON file or a dict, got {type(source).__name__}")


def _walk(config: Mapping[str, Any], key: str) -> tuple[Any, str]:
    """The dict holding the last part of ``key`` (``None`` when a level is missing) and that part."""
    *parents, last = key.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return None, last
    return node, last


def get_value(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` (``default`` when absent)."""
    node, last = _walk(config, key)
    if not isinstance(node, Mapping):
        return default
    return node.get(last, default)


def set_value(config: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key``, creating the intermediate sections."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[last] = value


def is_auto(config: Mapping[str, Any], key: str) -> bool:
    """True when dotted ``key`` is present with the value ``"auto"``."""
    return get_value(config, key, _MISSING) == AUTO


def auto_keys(config: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every dotted key whose value is still ``"auto"``."""
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            yield from auto_keys(value, key + ".")
        elif value == AUTO:
            yield key


def fill_auto(config: dict[str, Any], values: Mapping[str, Any], must_match: bool = False) -> list[str]:
    """Replace ``"auto"`` at each dotted key of ``values`` with its value.

    Returns the mismatches: keys set to a concrete value that differs from ``values`` (only collected
    with ``must_match``). A ``None`` value resolves nothing.
    """
    mismatches = []
    for key, value in values.items():
        if value is None:
            continue
        current = get_value(config, key, _MISSING)
        if current is _MISSING:
            continue
        if current == AUTO:
            set_value(config, key, value)
        elif must_match and not _same(current, value):
            mismatches.append(f"{key}: the DeepSpeed config has {current!r}, the run has {value!r}")
    return mismatches


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a) == _as_bool(b)
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return bool(a == b)


def _as_bool(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


# -- building -----------------------------------------------------------------------------------


def config_from_fields(
    zero_stage: int,
    gradient_accumulation_steps: Any,
    gradient_clipping: Any,
    offload_optimizer_device: str | None,
    offload_param_device: str | None,
    offload_optimizer_nvme_path: str | None,
    offload_param_nvme_path: str | None,
    zero3_save_16bit_model: bool,
) -> dict[str, Any]:
    """The DeepSpeed config a plugin without a JSON file stands for (batch sizes left ``"auto"``)."""
    offload_optimizer: dict[str, Any] = {"device": offload_optimizer_device or "none"}
    if offload_optimizer["device"] == "nvme":
        offload_optimizer["nvme_path"] = offload_optimizer_nvme_path
    offload_param: dict[str, Any] = {"device": offload_param_device or "none"}
    if offload_param["device"] == "nvme":
        offload_param["nvme_path"] = offload_param_nvme_path
    config: dict[str, Any] = {
        "train_batch_size": AUTO,
        "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO if gradient_accumulation_steps is None else gradient_accumulation_steps,
        "zero_optimization": {
            "stage": zero_stage,
            "offload_optimizer": offload_optimizer,
            "offload_param": offload_param,
            "stage3_gather_16bit_weights_on_model_save": bool(zero3_save_16bit_model),
        },
    }
    # Without a value there is no clipping (DeepSpeed's own default clips at 1.0 since 0.17).
    config["gradient_clipping"] = 0.0 if gradient_clipping in (None, AUTO) else gradient_clipping
    return config


def check_config_file_fields(fields: list[str] | None, mixed_precision_set: bool = False) -> None:
    """Refuse accel config keys that a ``deepspeed_config_file`` makes meaningless (they would be ignored)."""
    ignored = [name for name in (fields or []) if name not in CONFIG_FILE_COMPANION_FIELDS]
    if mixed_precision_set and "mixed_precision" not in ignored:
        ignored.append("mixed_precision")
    if ignored:
        raise ValueError(
            f"with `deepspeed_config_file`, these accel config settings would be ignored: {sorted(ignored)} "
            f"(When using `deepspeed_config_file`, the following accelerate config variables will be ignored: "
            f"{sorted(ignored)}). "
            'Set them in the DeepSpeed JSON file instead (or to "auto" there and pass them as `accel launch` '
            "flags), and remove them from the accel config file; next to `deepspeed_config_file` it may only "
            f"hold {sorted(CONFIG_FILE_COMPANION_FIELDS - {'deepspeed_config_file'})}. `accel config` asks only "
            "for those when you give a DeepSpeed config file."
        )


# -- mixed precision ----------------------------------------------------------------------------


def resolve_mixed_precision(config: dict[str, Any], mode: str) -> None:
    """Make the config's fp16 / bf16 sections agree with ``mixed_precision=mode``.

    A section the config enables for the other half-precision type is an error; a missing one is
    added; ``"auto"`` follows ``mode``. ``fp8`` runs the engine in bf16 (the FP8 layers are torchao's).
    """
    if mode == "fp8":
        if _as_bool(get_value(config, "fp16.enabled")) is True:
            raise ValueError(
                "mixed_precision='fp8' under DeepSpeed runs what is not FP8 in bf16, but the DeepSpeed config "
                'enables fp16; set fp16.enabled to "auto" or false in the config'
            )
        mode = "bf16"
    if mode in ("fp16", "bf16"):
        other = "bf16" if mode == "fp16" else "fp16"
        if _as_bool(get_value(config, f"{other}.enabled")) is True:
            raise ValueError(
                f"mixed_precision={mode!r} contradicts the DeepSpeed config, which enables {other} "
                f"(`--mixed_precision` arg cannot be set to `{mode}` when `{other}` is set in the DeepSpeed config "
                "file); "
                f'use mixed_precision={other!r}, or set {other}.enabled to "auto" or false in the config'
            )
        if not isinstance(config.get(mode), dict):
            config[mode] = {"enabled": True}
            if mode == "fp16":
                config[mode]["auto_cast"] = True
    for dtype in ("fp16", "bf16"):
        config.setdefault(dtype, {"enabled": False})
        if isinstance(config[dtype], dict):
            fill_auto(config, {f"{dtype}.enabled": mode == dtype})


def effective_mixed_precision(config: Mapping[str, Any]) -> str:
    """``fp16``, ``bf16`` or ``no``: what the config makes the engine train in."""
    for dtype in ("fp16", "bf16"):
        if _as_bool(get_value(config, f"{dtype}.enabled")) is True:
            return dtype
    return "no"


# -- values seen at prepare ---------------------------------------------------------------------


def micro_batch_size(batch_sizes: list[int | None], take_min: bool = True) -> int | None:
    """The micro batch size from the prepared loaders' per-process batch sizes (``None``: no loader)."""
    if not batch_sizes:
        return None
    if any(size is None for size in batch_sizes):
        raise ValueError(
            "a prepared DataLoader has no integer batch size (it uses a custom batch sampler), so DeepSpeed's "
            "train_micro_batch_size_per_gpu cannot be derived: set it to an integer in the DeepSpeed config "
            "(At least one of the dataloaders passed to `prepare()` has `None` as batch size.)"
        )
    sizes = [int(size) for size in batch_sizes]  # type: ignore[arg-type]
    return min(sizes) if take_min else max(sizes)


def hidden_size_of(model: Any) -> int | None:
    """``model.config.hidden_size`` or ``max(model.config.hidden_sizes)`` (``None`` when neither exists)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    size = getattr(config, "hidden_size", None)
    if size is None and getattr(config, "hidden_sizes", None):
        size = max(config.hidden_sizes)
    return int(size) if size is not None else None


def hidden_size_values(config: Mapping[str, Any], model: Any) -> dict[str, int]:
    """Values for the hidden-size based ``"auto"`` keys; an error naming them when the model has no size."""
    wanted = [key for key in HIDDEN_SIZE_KEYS if is_auto(config, key)]
    if not wanted:
        return {}
    hidden = hidden_size_of(model)
    if hidden is None:
        raise ValueError(
            f'the DeepSpeed config leaves {wanted} as "auto", which accel derives from the model\'s '
            "`config.hidden_size` (or `config.hidden_sizes`), but the model has neither; "
            'replace "auto" with integers for these keys'
        )
    return {
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
    }


def scheduler_values(
    max_lr: float | None, warmup_num_steps: int, total_num_steps: int | None, num_processes: int, split_batches: bool
) -> dict[str, Any]:
    """Values for the ``"auto"`` parameters of a scheduler defined in the config (DummyScheduler)."""
    values: dict[str, Any] = {
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": max_lr,
        "scheduler.params.warmup_num_steps": warmup_num_steps,
    }
    if total_num_steps is not None:
        # Each process sees 1/num_processes of the batches, unless batches are split.
        values["scheduler.params.total_num_steps"] = (
            total_num_steps if split_batches else math.ceil(total_num_steps / num_processes)
        )
    return values


#: Defaults DeepSpeed itself uses, for ``"auto"`` keys nothing in the run determines.
ENGINE_DEFAULTS: dict[str, Any] = {
    "gradient_clipping": 1.0,
    "zero_optimization.stage3_max_live_parameters": 1_000_000_000,
    "zero_optimization.stage3_max_reuse_distance": 1_000_000_000,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
}


def resolve_batch_sizes(
    config: dict[str, Any], micro: int | None, accumulation_steps: int, world_size: int, training: bool = True
) -> int:
    """Fill the batch-size and accumulation ``"auto"`` values; returns the accumulation steps in force.

    ``micro`` is the per-process batch size of the prepared loaders (``None``: none prepared). A
    concrete ``train_micro_batch_size_per_gpu`` that differs from it wins, with a warning (as
    documented); a concrete ``train_batch_size`` that is not ``micro * accumulation * world_size`` is
    an error.
    """
    fill_auto(config, {"gradient_accumulation_steps": accumulation_steps})
    steps = get_value(config, "gradient_accumulation_steps", 1)
    steps = int(steps) if steps is not None else 1
    configured = get_value(config, "train_micro_batch_size_per_gpu", _MISSING)
    if configured is _MISSING and get_value(config, "train_batch_size", _MISSING) is _MISSING:
        configured = AUTO  # neither batch key given: the loader's, as for "auto"
    if training and micro is not None and configured not in (_MISSING, AUTO) and int(configured) != micro:
        # As documented, the config wins: the engine counts samples by its own micro batch size.
        logger.warning(
            "the DeepSpeed config sets train_micro_batch_size_per_gpu=%s, but the prepared DataLoader gives each "
            'process batches of %s; the config\'s value is used (set it to "auto" to follow the DataLoader)',
            configured,
            micro,
        )
    if configured == AUTO:
        if micro is None:
            total = get_value(config, "train_batch_size")
            if isinstance(total, int):
                micro = total // (steps * world_size)
            else:
                raise ValueError(
                    'the DeepSpeed config leaves train_micro_batch_size_per_gpu as "auto", which accel takes from '
                    "the prepared DataLoader, but none was prepared: pass the training (or evaluation) DataLoader "
                    "to the same `prepare` call as the model, or set train_micro_batch_size_per_gpu to an integer "
                    "(When using DeepSpeed, `prepare()` requires you to pass at least one of training or evaluation "
                    "dataloaders with `batch_size` attribute returning an integer value.)"
                )
        set_value(config, "train_micro_batch_size_per_gpu", micro)
    micro_now = get_value(config, "train_micro_batch_size_per_gpu")
    if isinstance(micro_now, int):
        expected = micro_now * steps * world_size
        fill_auto(config, {"train_batch_size": expected})
        total = get_value(config, "train_batch_size")
        if total is not None and int(total) != expected:
            raise ValueError(
                f"the DeepSpeed config sets train_batch_size={total}, but train_micro_batch_size_per_gpu "
                f"({micro_now}) x gradient_accumulation_steps ({steps}) x data-parallel processes ({world_size}) "
                f"= {expected}"
            )
    return steps


def missing_auto_error(keys: list[str]) -> ValueError:
    """The error for ``"auto"`` values that ``fill_match`` / ``deepspeed_config_process`` were asked to
    resolve but not given a value for; names every such key (the first in the documented wording, so a
    pasted error finds its answers).

    Args:
        keys: the dotted keys still ``"auto"``, at least one.
    """
    first = keys[0]
    return ValueError(
        f'the DeepSpeed config values {keys} are "auto" but no value was given for them: `{first}` not found '
        f"in kwargs. Please specify `{first}` without `auto` (set to correct value) in the DeepSpeed config, or "
        "pass each of them as a keyword argument (its dotted key)"
    )


def unresolved_error(keys: list[str]) -> ValueError:
    """The error for ``"auto"`` values that nothing in the run could resolve."""
    return ValueError(
        f'these DeepSpeed config values are "auto" but nothing in the run determines them: {keys}. '
        'Replace "auto" with a value in the config (accel fills "auto" only for batch sizes, accumulation, '
        "clipping, fp16/bf16, ZeRO stage and offload settings, the optimizer's lr and weight_decay (DummyOptim), "
        "the scheduler's warm-up and total steps (DummyScheduler) and the hidden-size based bucket sizes)"
    )

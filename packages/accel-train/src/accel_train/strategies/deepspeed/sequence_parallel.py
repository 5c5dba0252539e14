"""ALST / Ulysses sequence parallelism through DeepSpeed (``ParallelismConfig(sp_size=N, sp_backend="deepspeed")``).

Each sample's sequence is split over ``sp_size`` ranks. DeepSpeed's ``UlyssesSPAttentionHF`` takes the
place of a transformers attention function (``sdpa``, ``flash_attention_2``, ...): before the core
attention an all-to-all trades the sequence split for a head split, so every rank attends over the full
sequence for its share of the heads, and a second all-to-all trades back. The rest of the model runs on
the rank's sequence shard. ``UlyssesSPDataLoaderAdapter`` feeds it: it gathers one batch from each rank
of the group and hands every rank its shard of each, in turn, with ``shift_labels`` for the loss.

This module holds the settings (`DeepSpeedSequenceParallelConfig`, parsed once) and the steps the
DeepSpeed strategy runs at ``prepare``: checks of the model, registration with transformers (which
returns DeepSpeed's sequence-parallel groups, the ``mpu`` handed to ``deepspeed.initialize``) and the
data-loader adapter. DeepSpeed and transformers are imported when a run uses them.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

from accel_state.install_hints import install_hint
from accel_train.plugin_env import env_value

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "MIN_DEEPSPEED",
    "adapt_loader",
    "check_model",
    "register_with_transformers",
]

#: The DeepSpeed release that brought ``deepspeed.runtime.sequence_parallel.ulysses_sp``.
MIN_DEEPSPEED = "0.18.2"

#: Attention implementations of transformers that the Ulysses wrapper takes over.
BUILTIN_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3")
#: Implementations refused by name: ``eager`` needs the full 4-D mask, ``flex_attention`` is not wrapped.
UNSUPPORTED_ATTENTION = ("eager", "flex_attention")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Settings of DeepSpeed's ALST / Ulysses sequence parallelism, given as ``ParallelismConfig(sp_handler=...)``.

    Fields left ``None`` take the value ``accel launch`` wrote (``PARALLELISM_CONFIG_SP_*``), else the
    default. Read once, here.

    Args:
        sp_seq_length: The sequence length of every batch, when all batches have the same one; divisible by
            ``sp_size``. Needed when ``sp_seq_length_is_variable`` is `False`. Defaults to `None`
            (``PARALLELISM_CONFIG_SP_SEQ_LENGTH``, else unset).
        sp_seq_length_is_variable: Whether the sequence length may change from batch to batch (the shapes
            are then taken from each batch). Defaults to `None` (``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE``,
            else `True`).
        sp_attn_implementation: The transformers attention implementation wrapped by Ulysses: `sdpa`,
            `flash_attention_2`, `flash_attention_3`, or a hub flash-attention kernel (`org/flash-attn...`). The
            model must be built with the same ``attn_implementation``. Defaults to `None`
            (``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION``, else `sdpa`).

    Raises:
        ValueError: A length that is not a positive integer, a fixed length without ``sp_seq_length``, or an
            attention implementation Ulysses cannot wrap.
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = env_value("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", True)
        elif not isinstance(self.sp_seq_length_is_variable, bool):
            raise ValueError(
                "DeepSpeedSequenceParallelConfig.sp_seq_length_is_variable must be True or False, got "
                f"{self.sp_seq_length_is_variable!r}"
            )
        if self.sp_seq_length is None:
            self.sp_seq_length = _length(
                env_value("PARALLELISM_CONFIG_SP_SEQ_LENGTH"), "PARALLELISM_CONFIG_SP_SEQ_LENGTH"
            )
        else:
            self.sp_seq_length = _length(self.sp_seq_length, "DeepSpeedSequenceParallelConfig.sp_seq_length")
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raise ValueError(
                "DeepSpeedSequenceParallelConfig.sp_seq_length_is_variable=False needs the fixed length: give "
                "sp_seq_length=<tokens per sample> (or PARALLELISM_CONFIG_SP_SEQ_LENGTH / --parallelism_config_"
                "sp_seq_length), or set sp_seq_length_is_variable=True"
            )
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = env_value("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", "sdpa")
        self.sp_attn_implementation = _attention(self.sp_attn_implementation)

    def local_seq_length(self, sp_size: int) -> int | None:
        """Tokens of each rank's shard for the fixed length (``None`` when lengths vary).

        Args:
            sp_size: Size of the sequence-parallel group.

        Raises:
            ValueError: ``sp_seq_length`` is not divisible by ``sp_size``.
        """
        if self.sp_seq_length_is_variable or self.sp_seq_length is None:
            return None
        if self.sp_seq_length % sp_size:
            raise ValueError(
                f"DeepSpeedSequenceParallelConfig.sp_seq_length={self.sp_seq_length} is not divisible by "
                f"sp_size={sp_size}: every rank holds an equal shard of the sequence; pad the samples to a "
                f"multiple of {sp_size}"
            )
        return self.sp_seq_length // sp_size


def _length(value: Any, name: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "none")):
        return None
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 1 or (isinstance(value, float) and value != number):
        raise ValueError(f"{name} must be a positive number of tokens, got {value!r}")
    return number


def _attention(value: Any) -> str:
    name = str(value)
    if name in UNSUPPORTED_ATTENTION:
        raise ValueError(
            f"DeepSpeedSequenceParallelConfig.sp_attn_implementation={name!r} cannot run under sequence "
            f"parallelism ({'it needs the full 4-D attention mask' if name == 'eager' else 'Ulysses does not wrap it here'}); "
            f"use one of {', '.join(BUILTIN_ATTENTION)} and build the model with the same attn_implementation"
        )
    if name not in BUILTIN_ATTENTION and not ("/" in name and "flash-attn" in name):
        raise ValueError(
            f"DeepSpeedSequenceParallelConfig.sp_attn_implementation={name!r} is not one Ulysses wraps: use one "
            f"of {', '.join(BUILTIN_ATTENTION)}, or a hub flash-attention kernel such as "
            "'kernels-community/flash-attn2'"
        )
    return name


# -- at prepare --------------------------------------------------------------------------------------


def check_model(model: Any, handler: DeepSpeedSequenceParallelConfig, sp_size: int) -> None:
    """Refuse, by name, a model Ulysses would run wrongly or not at all.

    Args:
        model: The model about to be handed to DeepSpeed.
        handler: The sequence-parallel settings.
        sp_size: Size of the sequence-parallel group.

    Raises:
        ValueError: The model has no transformers ``config``, attends with another implementation than
            ``sp_attn_implementation``, has head counts that do not split over ``sp_size``, or has layers
            carrying a recurrent state along the sequence.
    """
    config = getattr(model, "config", None)
    if config is None or (not hasattr(config, "num_attention_heads") and not hasattr(config, "get_text_config")):
        raise ValueError(
            f"sequence parallelism (sp_size={sp_size}) wraps the attention of a transformers model, and "
            f"{type(model).__name__} has no transformers `config`; prepare a transformers PreTrainedModel"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    used = getattr(config, "_attn_implementation", None)
    if used is not None and used != handler.sp_attn_implementation:
        raise ValueError(
            f"the model attends with attn_implementation={used!r} but sequence parallelism wraps "
            f"sp_attn_implementation={handler.sp_attn_implementation!r}; build the model with "
            f"attn_implementation={handler.sp_attn_implementation!r} or set sp_attn_implementation={used!r}"
        )
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if isinstance(heads, int) and heads % sp_size:
        raise ValueError(
            f"the model has {heads} attention heads, which do not split over sp_size={sp_size}: Ulysses gives "
            "each rank an equal share of the heads; choose an sp_size that divides the head count"
        )
    if isinstance(kv_heads, int) and kv_heads % sp_size and sp_size % kv_heads:
        raise ValueError(
            f"the model has {kv_heads} key/value heads and sp_size={sp_size}: one must divide the other for "
            "Ulysses to share the key/value heads out"
        )
    recurrent = sorted({kind for kind in getattr(text, "layer_types", None) or [] if "linear_attention" in str(kind)})
    if recurrent:
        raise ValueError(
            f"sequence parallelism cannot run {type(model).__name__}: its layers of type {recurrent} carry a "
            "state along the sequence outside the attention function Ulysses wraps, so each rank would restart "
            "it from zero and the gradients would be silently wrong; use a full-attention model or sp_size=1"
        )


def _require_ulysses() -> None:
    from packaging.version import Version

    from accel_train.strategies.deepspeed.utils import import_deepspeed

    import_deepspeed()
    have = importlib.metadata.version("deepspeed")
    if Version(have) < Version(MIN_DEEPSPEED):
        raise ImportError(
            f"DeepSpeed ALST/Ulysses sequence parallelism needs deepspeed>={MIN_DEEPSPEED}, found {have}: "
            f"{install_hint(f'deepspeed>={MIN_DEEPSPEED}')}"
        )
    try:
        importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"DeepSpeed ALST/Ulysses sequence parallelism wraps transformers' attention: {install_hint('transformers')}"
        ) from None


def register_with_transformers(
    model: Any, handler: DeepSpeedSequenceParallelConfig, sp_size: int, micro_batch_size: int
) -> Any:
    """Put Ulysses in place of the model's attention function and build DeepSpeed's sequence-parallel
    groups; returns them (the ``mpu`` of ``deepspeed.initialize``).

    Args:
        model: The transformers model (checked with `check_model()` first).
        handler: The sequence-parallel settings.
        sp_size: Size of the sequence-parallel group.
        micro_batch_size: Samples per rank and step (``train_micro_batch_size_per_gpu``).

    Raises:
        ImportError: DeepSpeed older than `MIN_DEEPSPEED`, or transformers missing.
    """
    _require_ulysses()
    check_model(model, handler, sp_size)
    handler.local_seq_length(sp_size)  # the divisibility check, before DeepSpeed's own assertion
    import inspect

    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    if getattr(parallel_state_sp, "_SEQUENCE_PARALLEL_GROUP", None) is not None:
        raise RuntimeError(
            "DeepSpeed's sequence-parallel groups already exist in this process (a model was prepared with "
            "sequence parallelism before): DeepSpeed builds them once per process, so prepare one model per run"
        )
    extra: dict[str, Any] = {}
    if "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters:
        extra["disable_in_eval"] = True  # evaluation (model.eval()) runs each rank's batch whole
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=handler.sp_attn_implementation,
        sequence_parallel_size=sp_size,
        micro_batch_size=micro_batch_size,
        seq_length=handler.sp_seq_length,
        seq_length_is_variable=handler.sp_seq_length_is_variable,
        **extra,
    )


def adapt_loader(loader: Any, mpu: Any, device: Any) -> Any:
    """``loader`` wrapped in DeepSpeed's ``UlyssesSPDataLoaderAdapter`` over the groups of ``mpu`` (DeepSpeed's
    registered groups when ``mpu`` is ``None``).

    Each batch must be a dict with ``input_ids``, ``position_ids`` and ``labels`` shaped
    ``[batch, seq, ...]``; each rank receives its sequence shard with ``shift_labels`` in place of
    ``labels`` (the loss is computed outside the model), and the loader yields ``sp_size`` times as
    many batches.

    Args:
        loader: The (prepared) data loader.
        mpu: What `register_with_transformers()` returned, or `None`.
        device: Device the gathered batches are assembled on.
    """
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    if mpu is None:
        from deepspeed.utils import groups

        rank = groups._get_sequence_parallel_rank()
        group = groups._get_sequence_parallel_group()
        size = groups._get_sequence_parallel_world_size()
    else:
        rank = mpu.get_sequence_parallel_rank()
        group = mpu.get_sequence_parallel_group()
        size = mpu.get_sequence_parallel_world_size()
    return UlyssesSPDataLoaderAdapter(loader, sp_rank=rank, sp_group=group, sp_world_size=size, device=device)

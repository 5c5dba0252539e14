"""Kwargs handlers: small validated dataclasses that customise one object the Accelerator builds.

Pass them to ``Accelerator(kwargs_handlers=[...])``; each kind may be given once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accel_state.enums import AmaxComputeAlgorithm, FP8BackendType, FP8Format, MSAMPOptLevel
from accel_state.environment import str_to_bool
from accel_state.kwargs import InitProcessGroupKwargs, KwargsHandler
from accel_train.plugin_env import fill_from_env

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "MSAMPRecipeKwargs",
    "ProfileKwargs",
    "TERecipeKwargs",
]


def _choice(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name}={value!r} is not valid; choose one of {list(choices)}")


class DDPCommunicationHookType(str, enum.Enum):
    """Gradient communication hooks of ``DistributedDataParallel``."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return str(self.value)


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments of ``torch.autocast`` used in mixed precision (``enabled``, ``cache_enabled``).

    Args:
        enabled: Whether autocasting is on in the regions the Accelerator wraps. Defaults to `True`.
        cache_enabled: Whether autocast caches the cast weights; `None` keeps torch's own default. Defaults to `None`.
    """

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"AutocastKwargs.enabled must be a bool, got {self.enabled!r}")


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments of ``torch.nn.parallel.DistributedDataParallel`` and its communication hook.

    ``comm_hook`` picks a gradient compression (fp16, bf16, PowerSGD); ``comm_wrapper`` (fp16 or bf16)
    wraps a PowerSGD hook; ``comm_state_option`` is passed to ``PowerSGDState``.

    Args:
        dim: Dimension along which inputs are scattered across devices. Defaults to `0`.
        broadcast_buffers: Whether module buffers are synchronised from rank 0 at each forward. Defaults to `True`.
        bucket_cap_mb: Size in MiB of the gradient buckets reduced together; must be positive. Defaults to `25`.
        find_unused_parameters: Whether DDP walks the autograd graph to find parameters that receive no gradient.
            Defaults to `False`.
        check_reduction: Deprecated DDP argument, passed through unchanged. Defaults to `False`.
        gradient_as_bucket_view: Whether gradients are views into the communication buckets, saving memory.
            Defaults to `False`.
        static_graph: Whether the model's graph and set of used parameters stay the same at every iteration.
            Defaults to `False`.
        comm_hook: Gradient communication hook: `no`, `fp16`, `bf16`, `power_sgd` or `batched_power_sgd`.
            Defaults to `DDPCommunicationHookType.NO`.
        comm_wrapper: Compression wrapped around a PowerSGD hook: `no`, `fp16` or `bf16`.
            Defaults to `DDPCommunicationHookType.NO`.
        comm_state_option: Keyword arguments of ``PowerSGDState`` (PowerSGD hooks only). Defaults to `{}`.
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.comm_hook = DDPCommunicationHookType(str(self.comm_hook).lower())
        except ValueError:
            raise ValueError(
                f"DistributedDataParallelKwargs.comm_hook={self.comm_hook!r} is not valid; choose one of "
                f"{[m.value for m in DDPCommunicationHookType]}"
            ) from None
        try:
            self.comm_wrapper = DDPCommunicationHookType(str(self.comm_wrapper).lower())
        except ValueError:
            self.comm_wrapper = self.comm_wrapper  # reported just below
        _choice(
            "DistributedDataParallelKwargs",
            "comm_wrapper",
            self.comm_wrapper,
            (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16),
        )
        if self.comm_wrapper != DDPCommunicationHookType.NO and self.comm_hook not in (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.BATCHED_POWER_SGD,
        ):
            raise ValueError(
                "DistributedDataParallelKwargs.comm_wrapper only applies to the PowerSGD hooks "
                f"(comm_hook='power_sgd' or 'batched_power_sgd'), got comm_hook={self.comm_hook.value!r}"
            )
        if not isinstance(self.comm_state_option, dict):
            raise TypeError(
                f"DistributedDataParallelKwargs.comm_state_option must be a dict, got {self.comm_state_option!r}"
            )
        if self.comm_state_option and self.comm_hook not in (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.BATCHED_POWER_SGD,
        ):
            raise ValueError("DistributedDataParallelKwargs.comm_state_option only applies to the PowerSGD hooks")
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"DistributedDataParallelKwargs.bucket_cap_mb must be > 0, got {self.bucket_cap_mb}")

    def ddp_arguments(self) -> dict[str, Any]:
        """The changed fields that ``DistributedDataParallel`` itself takes."""
        hook_fields = ("comm_hook", "comm_wrapper", "comm_state_option")
        return {key: value for key, value in self.to_kwargs().items() if key not in hook_fields}

    def register_comm_hook(self, model: Any) -> None:
        """Register the configured communication hook on a ``DistributedDataParallel`` model.

        Args:
            model: The model already wrapped in ``DistributedDataParallel``; nothing happens when ``comm_hook`` is `no`.

        Raises:
            ValueError: A bfloat16 hook or wrapper is asked for on a backend other than NCCL or XCCL.
        """
        if self.comm_hook == DDPCommunicationHookType.NO:
            return
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        bf16 = DDPCommunicationHookType.BF16
        if bf16 in (self.comm_hook, self.comm_wrapper) and dist.get_backend() not in ("nccl", "xccl"):
            raise ValueError(
                f"DDP communication hook {self.comm_hook.value!r} (wrapper {self.comm_wrapper.value!r}) compresses to "
                f"bfloat16, which torch supports only with NCCL (CUDA) or XCCL; this run uses {dist.get_backend()!r}. "
                "Use comm_hook='fp16' or 'power_sgd' here."
            )
        simple = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
        }
        if self.comm_hook in simple:
            model.register_comm_hook(state=None, hook=simple[self.comm_hook])
            return
        hook: Any = (
            powerSGD_hook.powerSGD_hook
            if self.comm_hook == DDPCommunicationHookType.POWER_SGD
            else powerSGD_hook.batched_powerSGD_hook
        )
        if self.comm_wrapper == DDPCommunicationHookType.FP16:
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif self.comm_wrapper == DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_wrapper(hook)
        state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
        model.register_comm_hook(state=state, hook=hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments of ``torch.amp.GradScaler`` used with ``mixed_precision="fp16"``.

    Args:
        init_scale: Initial loss scale; must be positive. Defaults to `65536.0`.
        growth_factor: Factor the scale is multiplied by after ``growth_interval`` steps without inf/NaN gradients;
            must be above 1. Defaults to `2.0`.
        backoff_factor: Factor the scale is multiplied by when a step has inf/NaN gradients; in (0, 1).
            Defaults to `0.5`.
        growth_interval: Number of consecutive clean steps before the scale grows; at least 1. Defaults to `2000`.
        enabled: Whether the scaler is active; when `False` its calls do nothing. Defaults to `True`.
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise ValueError(f"GradScalerKwargs.init_scale must be > 0, got {self.init_scale}")
        if self.growth_factor <= 1.0:
            raise ValueError(f"GradScalerKwargs.growth_factor must be > 1, got {self.growth_factor}")
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(f"GradScalerKwargs.backoff_factor must be in (0, 1), got {self.backoff_factor}")
        if self.growth_interval < 1:
            raise ValueError(f"GradScalerKwargs.growth_interval must be >= 1, got {self.growth_interval}")


_ACTIVITIES = ("cpu", "xpu", "mtia", "cuda", "hpu")
_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


@dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments of ``torch.profiler.profile`` for ``Accelerator.profile``.

    ``output_trace_dir`` set: each process writes a Chrome trace ``profile_{rank}.json`` there.

    Args:
        activities: Activities to profile, among `cpu`, `cuda`, `xpu`, `mtia` and `hpu`; `None` lets torch choose.
            Defaults to `None`.
        schedule_option: Keyword arguments of ``torch.profiler.schedule`` (`wait`, `warmup`, `active`, `repeat`,
            `skip_first`; `active` is required), or `None` to profile every step. Defaults to `None`.
        on_trace_ready: Callable run by the profiler each time a trace is ready. Defaults to `None`.
        record_shapes: Whether input shapes of the operators are recorded. Defaults to `False`.
        profile_memory: Whether tensor memory allocations and frees are tracked. Defaults to `False`.
        with_stack: Whether source information (file and line) of the operators is recorded. Defaults to `False`.
        with_flops: Whether FLOPs of matrix multiplications and convolutions are estimated. Defaults to `False`.
        with_modules: Whether the module hierarchy of each operator is recorded. Defaults to `False`.
        output_trace_dir: Folder where each process exports its Chrome trace. Defaults to `None`.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        for activity in self.activities or []:
            _choice("ProfileKwargs", "activities", activity, _ACTIVITIES)
        for key, value in (self.schedule_option or {}).items():
            _choice("ProfileKwargs", "schedule_option key", key, _SCHEDULE_KEYS)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"ProfileKwargs.schedule_option[{key!r}] must be an int >= 0, got {value!r}")
        if self.schedule_option is not None and "active" not in self.schedule_option:
            raise ValueError("ProfileKwargs.schedule_option needs at least the 'active' key")

    def _activities(self) -> list[Any] | None:
        if self.activities is None:
            return None
        import torch

        table = {
            "cpu": torch.profiler.ProfilerActivity.CPU,
            "cuda": torch.profiler.ProfilerActivity.CUDA,
            "xpu": getattr(torch.profiler.ProfilerActivity, "XPU", None),
            "mtia": getattr(torch.profiler.ProfilerActivity, "MTIA", None),
            "hpu": getattr(torch.profiler.ProfilerActivity, "HPU", None),
        }
        missing = [name for name in self.activities if table[name] is None]
        if missing:
            raise ValueError(f"this torch build cannot profile activities {missing}")
        return [table[name] for name in self.activities]

    def build(self) -> Any:
        """A ``torch.profiler.profile`` object configured from these fields."""
        import torch

        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return torch.profiler.profile(
            activities=self._activities(),
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


_FP8_FORMATS = (None, *FP8Format.list())
_AMAX_ALGOS = (None, *AmaxComputeAlgorithm.list())
_OPT_LEVELS = (None, *MSAMPOptLevel.list())


def _bool_triple(value: Any) -> tuple[bool, bool, bool] | None:
    """Three booleans from a tuple/list, or a single boolean meaning all three."""
    if value is None:
        return None
    if isinstance(value, bool):
        return (value, value, value)
    items = [bool(str_to_bool(v)) if isinstance(v, str) else bool(v) for v in value]
    if len(items) != 3:
        raise ValueError("override_linear_precision needs three booleans (fprop, dgrad, wgrad)")
    return (items[0], items[1], items[2])


@dataclass
class TERecipeKwargs(KwargsHandler):
    """FP8 recipe for TransformerEngine (used through accel-quant; needs ``transformer-engine``).

    Fields left ``None`` take the ``ACCELERATE_FP8_*`` values the launcher wrote, else the documented
    defaults (HYBRID format, margin 0, interval 1, amax history 1024, ``most_recent``).

    Args:
        use_autocast_during_eval: Whether FP8 autocast also applies in evaluation; otherwise only in training.
            Defaults to `None` (launcher value, else `False`).
        margin: Margin for the scaling factor computation. Defaults to `None` (launcher value, else `0`).
        interval: How often, in steps, the scaling factor is recomputed. Defaults to `None` (launcher value, else `1`).
        fp8_format: FP8 format, `HYBRID` (E4M3 forward, E5M2 backward) or `E4M3`; upper-cased.
            Defaults to `None` (launcher value, else `HYBRID`).
        amax_history_len: Length of the amax history window used for scaling. Defaults to `None`
            (launcher value, else `1024`).
        amax_compute_algo: How the amax is taken from the history, `max` or `most_recent`. Defaults to `None`
            (launcher value, else `most_recent`).
        override_linear_precision: Three booleans (fprop, dgrad, wgrad) choosing which linear-layer matmuls run in
            higher precision; a single boolean stands for all three. Defaults to `None`
            (launcher value, else all `False`).
        use_mxfp8_block_scaling: Whether the MXFP8 block-scaling recipe is used. Defaults to `None` (read as `False`).
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        fill_from_env(
            self,
            {
                "use_autocast_during_eval": ("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", False),
                "margin": ("ACCELERATE_FP8_MARGIN", 0),
                "interval": ("ACCELERATE_FP8_INTERVAL", 1),
                "fp8_format": ("ACCELERATE_FP8_FORMAT", "HYBRID"),
                "amax_history_len": ("ACCELERATE_FP8_AMAX_HISTORY_LEN", 1024),
                "amax_compute_algo": ("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", "most_recent"),
                "override_linear_precision": ("ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION", (False, False, False)),
            },
        )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = False
        if self.fp8_format is not None:
            self.fp8_format = str(self.fp8_format).upper()
        _choice(type(self).__name__, "fp8_format", self.fp8_format, _FP8_FORMATS)
        _choice(type(self).__name__, "amax_compute_algo", self.amax_compute_algo, _AMAX_ALGOS)
        try:
            self.override_linear_precision = _bool_triple(self.override_linear_precision)
        except ValueError:
            raise ValueError(
                f"{type(self).__name__}.override_linear_precision needs three booleans (fprop, dgrad, wgrad)"
            ) from None


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """FP8 recipe for MS-AMP (``opt_level`` O1 or O2; ``ACCELERATE_FP8_OPT_LEVEL``, else O2).

    Args:
        opt_level: MS-AMP optimisation level, `O1` (FP8 weights and gradients) or `O2` (also FP8 optimizer states).
            Defaults to `None` (launcher value, else `O2`).
    """

    opt_level: str | None = None

    def __post_init__(self) -> None:
        fill_from_env(self, {"opt_level": ("ACCELERATE_FP8_OPT_LEVEL", "O2")})
        _choice("MSAMPRecipeKwargs", "opt_level", self.opt_level, _OPT_LEVELS)


@dataclass
class AORecipeKwargs(KwargsHandler):
    """FP8 recipe for torchao (``Float8LinearConfig`` and a module filter).

    ``pad_inner_dim`` and ``enable_fsdp_float8_all_gather`` left ``None`` take the launcher's
    ``ACCELERATE_FP8_PAD_INNER_DIM`` / ``ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER`` (default true).

    Args:
        config: A torchao ``Float8LinearConfig``; `None` builds one from the two flags below. Defaults to `None`.
        module_filter_func: Callable ``(module, fqn) -> bool`` choosing which linear layers are converted to FP8;
            `None` uses the default filter. Defaults to `None`.
        pad_inner_dim: Whether inner dimensions are padded to multiples of 16 for the FP8 matmuls.
            Defaults to `None` (launcher value, else `True`).
        enable_fsdp_float8_all_gather: Whether FSDP all-gathers parameters in FP8. Defaults to `None`
            (launcher value, else `True`).
    """

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        fill_from_env(
            self,
            {
                "pad_inner_dim": ("ACCELERATE_FP8_PAD_INNER_DIM", True),
                "enable_fsdp_float8_all_gather": ("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", True),
            },
        )


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Deprecated umbrella FP8 recipe: ``backend`` picks TransformerEngine (``TE``), ``MSAMP`` or ``AO``.

    ``optimization_level`` is the documented spelling of ``opt_level``.

    Args:
        use_autocast_during_eval: Whether FP8 autocast also applies in evaluation; otherwise only in training.
            Defaults to `None` (launcher value, else `False`).
        margin: Margin for the scaling factor computation. Defaults to `None` (launcher value, else `0`).
        interval: How often, in steps, the scaling factor is recomputed. Defaults to `None` (launcher value, else `1`).
        fp8_format: FP8 format, `HYBRID` (E4M3 forward, E5M2 backward) or `E4M3`; upper-cased.
            Defaults to `None` (launcher value, else `HYBRID`).
        amax_history_len: Length of the amax history window used for scaling. Defaults to `None`
            (launcher value, else `1024`).
        amax_compute_algo: How the amax is taken from the history, `max` or `most_recent`. Defaults to `None`
            (launcher value, else `most_recent`).
        override_linear_precision: Three booleans (fprop, dgrad, wgrad) choosing which linear-layer matmuls run in
            higher precision; a single boolean stands for all three. Defaults to `None`
            (launcher value, else all `False`).
        use_mxfp8_block_scaling: Whether the MXFP8 block-scaling recipe is used. Defaults to `None` (read as `False`).
        opt_level: MS-AMP optimisation level, `O1` or `O2` (MS-AMP backend). Defaults to `None` (launcher value).
        backend: FP8 backend, `TE`, `MSAMP` or `AO`; upper-cased. Defaults to `None` (launcher value).
        optimization_level: Same as ``opt_level``; both given must agree. Defaults to `None`.
    """

    opt_level: str | None = None
    backend: str | None = None
    optimization_level: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.optimization_level is not None:
            if self.opt_level is not None and self.opt_level != self.optimization_level:
                raise ValueError(
                    f"FP8RecipeKwargs: opt_level={self.opt_level!r} and optimization_level="
                    f"{self.optimization_level!r} disagree; give one"
                )
            self.opt_level = self.optimization_level
        fill_from_env(
            self, {"backend": ("ACCELERATE_FP8_BACKEND", None), "opt_level": ("ACCELERATE_FP8_OPT_LEVEL", None)}
        )
        if self.backend is not None:
            self.backend = str(self.backend).upper()
        _choice("FP8RecipeKwargs", "backend", self.backend, (None, *(b for b in FP8BackendType.list() if b != "NO")))
        _choice("FP8RecipeKwargs", "opt_level", self.opt_level, _OPT_LEVELS)

"""FP8 recipes as plain validated values, read from arguments or the ``ACCELERATE_FP8_*`` environment.

accel-train's ``TERecipeKwargs`` / ``MSAMPRecipeKwargs`` / ``AORecipeKwargs`` hand their fields to
these; nothing here imports a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from accel_state import env_vars
from accel_state.enums import AmaxComputeAlgorithm, FP8Format, MSAMPOptLevel
from accel_state.environment import str_to_bool

FP8_FORMATS = tuple(FP8Format.list())
AMAX_COMPUTE_ALGOS = tuple(AmaxComputeAlgorithm.list())
OPT_LEVELS = tuple(MSAMPOptLevel.list())
# TransformerEngine runs only these GEMMs in higher precision: none, or the weight gradient.
_OVERRIDES = ((False, False, False), (False, False, True))


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def _bools(value: Any) -> tuple[bool, bool, bool]:
    items = list(value)
    if len(items) != 3:
        raise ValueError(f"override_linear_precision needs three booleans (fprop, dgrad, wgrad), got {value!r}.")
    flags = tuple(bool(str_to_bool(v)) if isinstance(v, str) else bool(v) for v in items)
    return flags  # type: ignore[return-value]


@dataclass
class TERecipe:
    """A TransformerEngine FP8 recipe (``DelayedScaling``, or ``MXFP8BlockScaling`` with ``use_mxfp8_block_scaling``).

    Args:
        margin: Margin of the scaling factor's exponent.
        interval: How often (in steps) the scaling factor is recomputed.
        fp8_format: `HYBRID` (E4M3 forward, E5M2 backward) or `E4M3`.
        amax_history_len: Number of steps of the amax history.
        amax_compute_algo: How the amax is taken from its history: `max` or `most_recent`.
        override_linear_precision: Run the (forward, data-gradient, weight-gradient) matmuls of Linear layers
            in higher precision.
        use_autocast_during_eval: Keep FP8 autocast in evaluation mode too.
        use_mxfp8_block_scaling: Use TransformerEngine's `MXFP8BlockScaling` recipe instead of
            `DelayedScaling`.
    """

    margin: int = 0
    interval: int = 1
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "most_recent"
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    use_autocast_during_eval: bool = False
    use_mxfp8_block_scaling: bool = False

    def __post_init__(self) -> None:
        _int("margin", self.margin, 0)
        _int("interval", self.interval, 1)
        _int("amax_history_len", self.amax_history_len, 1)
        self.fp8_format = str(self.fp8_format).upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8_format must be one of {FP8_FORMATS}, got {self.fp8_format!r}.")
        if self.fp8_format == "E5M2" and not self.use_mxfp8_block_scaling:
            raise ValueError(
                "fp8_format='E5M2' for every tensor cannot train with TransformerEngine's delayed scaling: use "
                "'HYBRID' (E4M3 forward, E5M2 gradients) for training or 'E4M3'."
            )
        self.amax_compute_algo = str(self.amax_compute_algo).lower()
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_COMPUTE_ALGOS}, got {self.amax_compute_algo!r}.")
        self.override_linear_precision = _bools(self.override_linear_precision)
        if self.override_linear_precision not in _OVERRIDES:
            raise ValueError(
                "override_linear_precision can only keep the weight-gradient GEMM in higher precision: use "
                f"(False, False, False) or (False, False, True), got {self.override_linear_precision}."
            )
        self.use_autocast_during_eval = bool(self.use_autocast_during_eval)
        self.use_mxfp8_block_scaling = bool(self.use_mxfp8_block_scaling)

    @classmethod
    def from_values(cls, environ: Mapping[str, str] | None = None, **values: Any) -> TERecipe:
        """A recipe from ``values``; a value left None comes from ``ACCELERATE_FP8_*``, else its default.

        Args:
            environ: The environment to read `ACCELERATE_FP8_*` variables from; `None` reads `os.environ`.
            values: Fields of the recipe; one left `None` comes from its `ACCELERATE_FP8_*` variable, else its
                default.
        """
        env: dict[str, Any] = {
            "margin": env_vars.read("ACCELERATE_FP8_MARGIN", environ),
            "interval": env_vars.read("ACCELERATE_FP8_INTERVAL", environ),
            "fp8_format": env_vars.read("ACCELERATE_FP8_FORMAT", environ),
            "amax_history_len": env_vars.read("ACCELERATE_FP8_AMAX_HISTORY_LEN", environ),
            "amax_compute_algo": env_vars.read("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", environ),
            "use_autocast_during_eval": env_vars.read("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", environ),
        }
        override = env_vars.read("ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION", environ)
        if override:
            env["override_linear_precision"] = override
        unknown = set(values) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise TypeError(f"TERecipe has no field(s) {sorted(unknown)}.")
        merged = {**env, **{k: v for k, v in values.items() if v is not None}}
        return cls(**merged)

    def to_kwargs(self) -> dict[str, Any]:
        """The recipe's fields as a dict (``fp8_format`` as its name)."""
        return asdict(self)


@dataclass
class MSAMPRecipe:
    """An MS-AMP recipe: its optimisation level, ``O1`` (8-bit weight gradients and communication) or ``O2`` (also 8/16-bit optimizer states).

    Args:
        opt_level: `O1` or `O2`.
    """

    opt_level: str = "O2"

    def __post_init__(self) -> None:
        level = str(self.opt_level).upper()
        if level not in OPT_LEVELS:
            hint = " (the letter O, not zero)" if level[:1] == "0" else ""
            hint += "; O3 needs DeepSpeed <= 0.9.2 and is not offered" if level == "O3" else ""
            raise ValueError(f"MS-AMP opt_level must be 'O1' or 'O2'{hint}, got {self.opt_level!r}.")
        self.opt_level = level

    @classmethod
    def from_values(cls, opt_level: str | None = None, environ: Mapping[str, str] | None = None) -> MSAMPRecipe:
        """A recipe from ``opt_level``, else ``ACCELERATE_FP8_OPT_LEVEL``, else O2.

        Args:
            opt_level: `O1` or `O2`; `None` reads `ACCELERATE_FP8_OPT_LEVEL`, else `O2`.
            environ: The environment to read `ACCELERATE_FP8_*` variables from; `None` reads `os.environ`.
        """
        return cls(opt_level or env_vars.read("ACCELERATE_FP8_OPT_LEVEL", environ))


@dataclass
class AORecipe:
    """A torchao float8 training recipe.

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; when None one is built from the fields below.
        module_filter_func: ``(module, fully_qualified_name) -> bool``, which Linear layers to convert;
            None converts every Linear layer except the first and the last, and those whose
            dimensions are not multiples of 16.
        enable_fsdp_float8_all_gather: all-gather weights in float8 under FSDP2.
        pad_inner_dim: pad inner dimensions to multiples of 16 in the float8 matmuls.
        emulate: emulate the float8 matmuls in higher precision (None: emulate when the device has no
            float8 tensor cores, i.e. without a CUDA GPU of compute capability 8.9 or newer).
    """

    config: Any = None
    module_filter_func: Callable[[nn.Module, str], bool] | None = None
    enable_fsdp_float8_all_gather: bool = True
    pad_inner_dim: bool = True
    emulate: bool | None = None

    def __post_init__(self) -> None:
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise TypeError(
                f"module_filter_func must be callable (module, name) -> bool, got {self.module_filter_func!r}."
            )
        if self.emulate is None:
            self.emulate = not has_fp8_tensor_cores()


def has_fp8_tensor_cores() -> bool:
    """True when the current CUDA device has float8 matmuls (compute capability 8.9 or newer)."""
    if not torch.cuda.is_available():
        return False
    return tuple(torch.cuda.get_device_capability()) >= (8, 9)

"""FP8 training with torchao: swap Linear layers for ``torchao.float8`` ``Float8Linear`` layers.

By default the first and the last Linear layers stay in high precision (training is unstable
otherwise), and so do layers whose dimensions are not multiples of 16 (float8 matmuls need them);
which layers were kept, and why, is logged once per conversion.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from torch import nn

from accel_quant._requirements import require_torchao
from accel_quant.fp8.recipes import AORecipe
from accel_state.logging import get_logger

logger = get_logger(__name__)

__all__ = [
    "build_ao_config",
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
    "precompute_float8_scales_for_fsdp",
]

FP8_DIM_MULTIPLE = 16
# (first, last) Linear names of the model being converted, for filter_first_and_last_linear_layers.
_FIRST_LAST: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "accel_fp8_first_last", default=(None, None)
)


def find_first_last_linear_layers(model: nn.Module) -> tuple[str | None, str | None]:
    """Names of the first and the last ``nn.Linear`` of ``model`` in module order (None when it has none).

    Args:
        model: The model (an `nn.Module`).
    """
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def fp8_compatible_dims(module: nn.Module) -> bool:
    """True when a Linear layer's input and output sizes are multiples of 16."""
    if not isinstance(module, nn.Linear):
        return True
    return module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0


def filter_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """Module filter: convert ``module`` unless its dimensions do not fit float8 or ``fqn`` is in ``layers_to_filter``.

    Args:
        module: The module being considered.
        fqn: Its fully qualified name in the model.
        layers_to_filter: Fully qualified names of the layers to keep unconverted.
    """
    if not fp8_compatible_dims(module):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str) -> bool:
    """Module filter: convert every Linear layer with float8-compatible dimensions except the model's first and last.

    The first and last layers are those of the model being converted by `convert_model_to_fp8_ao()`.

    Args:
        module: The module being considered.
        fqn: Its fully qualified name in the model.
    """
    return filter_linear_layers(module, fqn, list(_FIRST_LAST.get()))


def build_ao_config(recipe: AORecipe | None = None) -> Any:
    """The ``Float8LinearConfig`` of ``recipe`` (its own ``config`` when it has one)."""
    recipe = recipe or AORecipe()
    if recipe.config is not None:
        return recipe.config
    float8 = require_torchao()
    return float8.Float8LinearConfig(
        enable_fsdp_float8_all_gather=recipe.enable_fsdp_float8_all_gather,
        pad_inner_dim=recipe.pad_inner_dim,
        emulate=bool(recipe.emulate),
    )


def convert_model_to_fp8_ao(
    model: nn.Module,
    config: Any = None,
    module_filter_func: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Swap ``model``'s Linear layers (in place) for torchao float8 layers; return the model.

    ``config`` is a ``Float8LinearConfig`` (None: `build_ao_config()` defaults, emulated without
    float8 hardware). ``module_filter_func(module, fqn)`` says which Linear layers to convert (None:
    `filter_first_and_last_linear_layers()`).

    Args:
        model: The model, converted in place.
        config: A torchao `Float8LinearConfig`; `None` builds the default one.
        module_filter_func: Decides per `(module, fqn)` whether a Linear layer is converted; `None` uses
            `filter_first_and_last_linear_layers`.
    """
    float8 = require_torchao()
    if config is None:
        config = build_ao_config()
    user_filter = module_filter_func or filter_first_and_last_linear_layers
    first, last = find_first_last_linear_layers(model)
    kept: dict[str, str] = {}

    def decide(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return bool(user_filter(module, fqn))
        convert = bool(user_filter(module, fqn))
        if not convert:
            if not fp8_compatible_dims(module):
                kept[fqn] = f"{module.in_features}x{module.out_features} not multiples of {FP8_DIM_MULTIPLE}"
            elif fqn in (first, last) and module_filter_func is None:
                kept[fqn] = "first" if fqn == first else "last"
                if first == last:
                    kept[fqn] = "only Linear layer"
            else:
                kept[fqn] = "excluded by module_filter_func"
        return convert

    token = _FIRST_LAST.set((first, last))
    try:
        float8.convert_to_float8_training(model, module_filter_fn=decide, config=config)
    finally:
        _FIRST_LAST.reset(token)
    if kept:
        logger.warning(
            "FP8 (torchao): %d Linear layer(s) left in high precision: %s.",
            len(kept),
            "; ".join(f"{name} ({why})" for name, why in kept.items()),
        )
    return model


def has_ao_layers(model: nn.Module) -> bool:
    """True when ``model`` holds torchao ``Float8Linear`` layers.

    Args:
        model: The model (an `nn.Module`).
    """
    require_torchao()
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def precompute_float8_scales_for_fsdp(model: nn.Module, config: Any) -> None:
    """After an optimizer step under FSDP2 with float8 all-gather: compute the next weights' scales in one go."""
    if config is None or not getattr(config, "enable_fsdp_float8_all_gather", False):
        return
    float8 = require_torchao()
    float8.precompute_float8_dynamic_scale_for_fsdp(model)

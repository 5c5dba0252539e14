"""FP8 training with Microsoft MS-AMP: ``msamp.initialize`` casts the model and optimizer for an opt level.

Written against MS-AMP's public API (``msamp.initialize(model, optimizer, opt_level)`` returning the
cast model and optimizer; DeepSpeed configs take an ``"msamp"`` section). MS-AMP needs a CUDA GPU
and is installed from source.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from accel_quant._requirements import require_msamp
from accel_quant.fp8.recipes import MSAMPRecipe

__all__ = ["msamp_deepspeed_config", "msamp_initialize"]


def _recipe(recipe: MSAMPRecipe | str | None) -> MSAMPRecipe:
    if isinstance(recipe, MSAMPRecipe):
        return recipe
    return MSAMPRecipe.from_values(recipe)


def msamp_initialize(
    model: nn.Module, optimizer: Any, recipe: MSAMPRecipe | str | None = None
) -> tuple[nn.Module, Any]:
    """``(model, optimizer)`` cast by MS-AMP at ``recipe``'s opt level (O1 or O2; None: ACCELERATE_FP8_OPT_LEVEL, else O2).

    MS-AMP takes one model and one optimizer; O2 supports Adam / AdamW optimizers only.

    Args:
        model: The model to cast.
        optimizer: Its optimizer.
        recipe: An `MSAMPRecipe` or an opt level (`O1`, `O2`); `None` reads `ACCELERATE_FP8_OPT_LEVEL`.
    """
    level = _recipe(recipe).opt_level
    msamp = require_msamp()
    return msamp.initialize(model, optimizer, opt_level=level)  # type: ignore[no-any-return]


def msamp_deepspeed_config(recipe: MSAMPRecipe | str | None = None) -> dict[str, Any]:
    """The DeepSpeed config section that turns MS-AMP on at ``recipe``'s opt level."""
    return {"msamp": {"enabled": True, "opt_level": _recipe(recipe).opt_level}}

"""FP8 training with NVIDIA TransformerEngine: swap layers for ``te.Linear`` / ``te.LayerNorm`` and run under FP8 autocast.

Written against TransformerEngine's public PyTorch API (``transformer_engine.pytorch.Linear``,
``LayerNorm``, ``TransformerLayer``, ``autocast`` / ``fp8_autocast``; ``transformer_engine.common.recipe``
``DelayedScaling``, ``MXFP8BlockScaling``, ``Format``). TransformerEngine needs a CUDA GPU; the
planning and recipe translation here are pure and run anywhere.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from types import MethodType
from typing import Any

import torch
from torch import nn

from accel_quant._requirements import require_transformer_engine
from accel_quant.fp8.ao import FP8_DIM_MULTIPLE
from accel_quant.fp8.recipes import TERecipe
from accel_state.logging import get_logger

logger = get_logger(__name__)

__all__ = [
    "apply_fp8_autowrap",
    "build_te_recipe",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
    "plan_te_conversion",
    "te_recipe_kwargs",
]


# -- which layers convert (pure) -----------------------------------------------------------------
def plan_te_conversion(
    model: nn.Module, convert_linear: bool = True, convert_ln: bool = True
) -> tuple[dict[str, str], dict[str, str]]:
    """``(to_convert, kept)``: module name -> ``"Linear"`` / ``"LayerNorm"`` for the layers TransformerEngine
    replaces, and module name -> reason for the Linear / LayerNorm layers it leaves alone.

    TransformerEngine's FP8 GEMMs need both dimensions of a Linear weight to be multiples of 16; its
    LayerNorm normalises one trailing dimension and has an affine weight.
    """
    to_convert: dict[str, str] = {}
    kept: dict[str, str] = {}
    for name, module in model.named_modules():
        if type(module) is nn.Linear and convert_linear:
            if any(dim % FP8_DIM_MULTIPLE for dim in module.weight.shape):
                kept[name] = f"{module.in_features}x{module.out_features} not multiples of {FP8_DIM_MULTIPLE}"
            else:
                to_convert[name] = "Linear"
        elif type(module) is nn.LayerNorm and convert_ln:
            if len(module.normalized_shape) != 1 or module.weight is None:
                kept[name] = "LayerNorm over several dimensions or without affine weight"
            else:
                to_convert[name] = "LayerNorm"
    return to_convert, kept


# -- recipes (pure) ------------------------------------------------------------------------------
def te_recipe_kwargs(recipe: TERecipe | Mapping[str, Any] | None) -> tuple[str, dict[str, Any], bool]:
    """``(recipe class name, its keyword arguments, use_autocast_during_eval)`` for ``recipe``.

    A value left None comes from ``ACCELERATE_FP8_*``, else the default. ``fp8_format`` stays a name (``"HYBRID"``); `build_te_recipe()` turns it into TransformerEngine's
    ``Format``. ``interval`` is passed only to TransformerEngine releases that still take it.
    """
    if not isinstance(recipe, TERecipe):
        values = {} if recipe is None else dict(recipe) if isinstance(recipe, Mapping) else _to_kwargs(recipe)
        recipe = TERecipe.from_values(**{k: v for k, v in values.items() if k in TERecipe.__dataclass_fields__})
    if recipe.use_mxfp8_block_scaling:
        return "MXFP8BlockScaling", {"fp8_format": "E4M3"}, recipe.use_autocast_during_eval
    kwargs = {
        "margin": recipe.margin,
        "interval": recipe.interval,
        "fp8_format": recipe.fp8_format,
        "amax_history_len": recipe.amax_history_len,
        "amax_compute_algo": recipe.amax_compute_algo,
        "override_linear_precision": recipe.override_linear_precision,
    }
    return "DelayedScaling", kwargs, recipe.use_autocast_during_eval


def _to_kwargs(handler: Any) -> dict[str, Any]:
    if hasattr(handler, "to_kwargs"):
        found = handler.to_kwargs()
        # a KwargsHandler's to_kwargs keeps only changed fields: fall back to every field
        if dataclasses.is_dataclass(handler):
            found = {f.name: getattr(handler, f.name) for f in dataclasses.fields(handler)}
        return dict(found)
    if dataclasses.is_dataclass(handler) and not isinstance(handler, type):
        return dataclasses.asdict(handler)
    raise TypeError(
        f"Cannot read an FP8 recipe from {type(handler).__name__}: give a TERecipe, a dict or a recipe kwargs handler."
    )


def build_te_recipe(recipe: TERecipe | Mapping[str, Any] | None = None) -> tuple[Any, bool]:
    """``(TransformerEngine recipe object, use_autocast_during_eval)`` for ``recipe``."""
    require_transformer_engine()
    from transformer_engine.common import recipe as te_recipe

    name, kwargs, during_eval = te_recipe_kwargs(recipe)
    kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    recipe_cls = getattr(te_recipe, name)
    fields = {f.name: f for f in dataclasses.fields(recipe_cls)} if dataclasses.is_dataclass(recipe_cls) else {}
    interval = fields.get("interval")
    if "interval" in kwargs and (interval is None or interval.default == -1):
        kwargs.pop("interval")  # removed / deprecated in newer TransformerEngine releases
    return recipe_cls(**kwargs), during_eval


# -- model conversion ----------------------------------------------------------------------------
def _copy_params(src: Any, dst: Any) -> None:
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if getattr(src, "bias", None) is not None and getattr(dst, "bias", None) is not None:
            dst.bias.copy_(src.bias)


def convert_model(
    model: nn.Module, to_transformer_engine: bool = True, _convert_linear: bool = True, _convert_ln: bool = True
) -> None:
    """Replace ``model``'s ``nn.Linear`` / ``nn.LayerNorm`` layers by TransformerEngine ones (in place), or back with
    ``to_transformer_engine=False``. Layers TransformerEngine cannot take are kept, and listed once in the log.

    Args:
        model: The model, converted in place.
        to_transformer_engine: `True` converts to TransformerEngine layers, `False` back to torch's.
    """
    te = require_transformer_engine()
    if to_transformer_engine:
        to_convert, kept = plan_te_conversion(model, _convert_linear, _convert_ln)
        for name, kind in to_convert.items():
            old: Any = model.get_submodule(name)
            if kind == "Linear":
                new: nn.Module = te.Linear(
                    old.in_features, old.out_features, bias=old.bias is not None, params_dtype=old.weight.dtype
                )
            else:
                new = te.LayerNorm(old.normalized_shape[0], eps=old.eps, params_dtype=old.weight.dtype)
            _copy_params(old, new)
            _set_submodule(model, name, new)
        if kept:
            logger.warning(
                "FP8 (TransformerEngine): %d layer(s) left in high precision: %s.",
                len(kept),
                "; ".join(f"{n} ({why})" for n, why in kept.items()),
            )
        return
    modules: list[tuple[str, Any]] = list(model.named_modules())
    for name, module in modules:
        if isinstance(module, te.Linear) and _convert_linear:
            back: nn.Module = nn.Linear(
                module.in_features,
                module.out_features,
                bias=getattr(module, "bias", None) is not None,
                dtype=module.weight.dtype,
                device=module.weight.device,
            )
        elif isinstance(module, te.LayerNorm) and _convert_ln:
            back = nn.LayerNorm(
                module.weight.shape[0], eps=module.eps, dtype=module.weight.dtype, device=module.weight.device
            )
        else:
            continue
        _copy_params(module, back)
        _set_submodule(model, name, back)


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """True when ``model`` holds TransformerEngine ``Linear``, ``LayerNorm`` or ``TransformerLayer`` layers.

    Args:
        model: The model (an `nn.Module`).
    """
    te = require_transformer_engine()
    return any(isinstance(m, te.LayerNorm | te.Linear | te.TransformerLayer) for m in model.modules())


# -- forward under FP8 autocast ------------------------------------------------------------------
def _fp8_autocast(enabled: bool, recipe: Any) -> Any:
    te = require_transformer_engine()
    if hasattr(te, "autocast"):  # TransformerEngine >= 2.8
        return te.autocast(enabled=enabled, recipe=recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=recipe)


def contextual_fp8_autocast(
    model_forward: Callable[..., Any], fp8_recipe: Any, use_during_eval: bool = False
) -> Callable[..., Any]:
    """A ``forward(self, *args, **kwargs)`` that runs ``model_forward`` under TransformerEngine's FP8 autocast
    while the model trains (and in evaluation too with ``use_during_eval``).

    Args:
        model_forward: The model's `forward`.
        fp8_recipe: The TransformerEngine recipe to autocast with.
        use_during_eval: Autocast in evaluation mode too.
    """

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        enabled = use_during_eval or self.training
        with _fp8_autocast(enabled, fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    return forward


def apply_fp8_autowrap(model: nn.Module, fp8_recipe_handler: Any = None) -> nn.Module:
    """Make ``model.forward`` run under FP8 autocast with the recipe of ``fp8_recipe_handler``
    (a ``TERecipe``, a dict, or a ``TERecipeKwargs`` / ``FP8RecipeKwargs``); return the model.

    Args:
        model: The model whose `forward` is wrapped.
        fp8_recipe_handler: A `TERecipe`, a dict of its fields, or a `TERecipeKwargs` / `FP8RecipeKwargs`;
            `None` reads the environment.
    """
    recipe, during_eval = build_te_recipe(fp8_recipe_handler)
    new_forward = contextual_fp8_autocast(model.forward, recipe, during_eval)
    if hasattr(model.forward, "__func__"):
        model.forward = MethodType(new_forward, model)  # type: ignore[method-assign]
    else:
        model.forward = functools.partial(new_forward, model)  # type: ignore[method-assign]
    return model

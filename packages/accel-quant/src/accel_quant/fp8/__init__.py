"""FP8 training backends: torchao, TransformerEngine and MS-AMP (model conversion, recipes, backend choice).

Names load on first use; no backend is imported until a function that needs it runs.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports

_EXPORTS: dict[str, str] = {}
for _module, _names in {
    "backend": ("FP8BackendType", "choose_fp8_backend", "installed_fp8_backends", "parse_fp8_backend"),
    "recipes": ("AORecipe", "MSAMPRecipe", "TERecipe", "has_fp8_tensor_cores"),
    "ao": (
        "build_ao_config",
        "convert_model_to_fp8_ao",
        "filter_first_and_last_linear_layers",
        "filter_linear_layers",
        "find_first_last_linear_layers",
        "has_ao_layers",
        "precompute_float8_scales_for_fsdp",
    ),
    "transformer_engine": (
        "apply_fp8_autowrap",
        "build_te_recipe",
        "contextual_fp8_autocast",
        "convert_model",
        "has_transformer_engine_layers",
        "plan_te_conversion",
        "te_recipe_kwargs",
    ),
    "msamp": ("msamp_deepspeed_config", "msamp_initialize"),
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module
del _module, _names, _name

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

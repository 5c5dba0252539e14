"""bitsandbytes quantization and FP8 model conversion for accel.

Names load on first use (module ``__getattr__``): ``import accel_quant`` imports neither torch nor
any backend.
"""

from __future__ import annotations

from accel_quant.__about__ import __version__
from accel_state.lazy import lazy_exports

_EXPORTS: dict[str, str] = {"BnbQuantizationConfig": "bnb_config"}
for _module, _names in {
    "bnb": (
        "load_and_quantize_model",
        "get_quantized_model_device_map",
        "replace_with_bnb_layers",
        "quantize_bnb_layers",
        "get_keys_to_not_convert",
        "has_4bit_bnb_layers",
        "has_8bit_bnb_layers",
        "get_parameter_device",
        "quantized_model_bytes",
    ),
    "training": ("check_trainable_quantized_model", "is_bnb_quantized", "PURE_QUANTIZED_MESSAGE"),
    "fp8.backend": ("FP8BackendType", "choose_fp8_backend", "installed_fp8_backends", "parse_fp8_backend"),
    "fp8.recipes": ("AORecipe", "MSAMPRecipe", "TERecipe"),
    "fp8.ao": (
        "convert_model_to_fp8_ao",
        "filter_first_and_last_linear_layers",
        "filter_linear_layers",
        "find_first_last_linear_layers",
        "has_ao_layers",
    ),
    "fp8.transformer_engine": (
        "apply_fp8_autowrap",
        "contextual_fp8_autocast",
        "convert_model",
        "has_transformer_engine_layers",
    ),
    "fp8.msamp": ("msamp_initialize",),
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module
del _module, _names, _name

__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

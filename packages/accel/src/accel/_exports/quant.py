"""Names and module paths that accel-quant provides to the meta-package."""

_Q = "accel_quant"

TOP_LEVEL: dict[str, str] = {}

UTILS: dict[str, str] = {"BnbQuantizationConfig": f"{_Q}.bnb_config"}
UTILS.update(
    {
        name: f"{_Q}.bnb"
        for name in (
            "load_and_quantize_model",
            "get_quantized_model_device_map",
            "replace_with_bnb_layers",
            "get_keys_to_not_convert",
            "has_4bit_bnb_layers",
        )
    }
)
UTILS.update(
    {
        name: f"{_Q}.fp8.transformer_engine"
        for name in ("convert_model", "has_transformer_engine_layers", "contextual_fp8_autocast", "apply_fp8_autowrap")
    }
)
UTILS.update(
    {
        name: f"{_Q}.fp8.ao"
        for name in ("convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers")
    }
)

MODULES: dict[str, str] = {
    "accel.utils.bnb": f"{_Q}.bnb",
    "accel.utils.transformer_engine": f"{_Q}.fp8.transformer_engine",
    "accel.utils.ao": f"{_Q}.fp8.ao",
}

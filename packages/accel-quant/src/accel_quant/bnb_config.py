"""``BnbQuantizationConfig``: how ``load_and_quantize_model`` turns a model's Linear layers into bitsandbytes ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

_COMPUTE_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
_QUANT_TYPES = ("fp4", "nf4")
_TORCH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Defaults of the 4-bit-only and 8-bit-only options: setting one of them away from its default
# while loading in the other width is a mistake we report.
_FOUR_BIT_DEFAULTS: dict[str, Any] = {
    "bnb_4bit_quant_type": "fp4",
    "bnb_4bit_use_double_quant": False,
    "bnb_4bit_compute_dtype": "fp16",
    "bnb_4bit_quant_storage": torch.uint8,
}
# dtypes bitsandbytes can pack 4-bit values into (uint8 is its default; others let FSDP shard the
# packed weights together with the unquantized ones)
_STORAGE_DTYPES = {
    "uint8": torch.uint8,
    "int8": torch.int8,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
_EIGHT_BIT_DEFAULTS: dict[str, Any] = {"llm_int8_threshold": 6.0}


def _dtype(value: Any, what: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        if value not in _TORCH_DTYPES:
            raise ValueError(f"{what} must be torch.float32, torch.float16 or torch.bfloat16, got {value}.")
        return value
    if isinstance(value, str) and value.replace("torch.", "") in _COMPUTE_DTYPES:
        return _COMPUTE_DTYPES[value.replace("torch.", "")]
    raise ValueError(
        f"{what} must be a torch dtype (float32, float16, bfloat16) or one of {sorted(_COMPUTE_DTYPES)}, got {value!r}."
    )


def _storage_dtype(value: Any) -> torch.dtype:
    name = str(value).replace("torch.", "") if isinstance(value, torch.dtype | str) else None
    if name not in _STORAGE_DTYPES:
        raise ValueError(
            f"bnb_4bit_quant_storage must be one of torch.{', torch.'.join(_STORAGE_DTYPES)} (or its name), got {value!r}."
        )
    return _STORAGE_DTYPES[name]


def _names(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of module names (strings), got {value!r}.")
    return list(value)


@dataclass
class BnbQuantizationConfig:
    """What to quantize with bitsandbytes, and how.

    Args:
        load_in_8bit: quantize Linear layers to int8 (LLM.int8()).
        llm_int8_threshold: outlier threshold of LLM.int8(): input columns whose magnitude exceeds it
            are multiplied in 16-bit (8-bit only; 0 disables the decomposition).
        load_in_4bit: quantize Linear layers to 4 bits (FP4 or NF4, QLoRA).
        bnb_4bit_quant_type: ``"fp4"`` or ``"nf4"`` (4-bit only).
        bnb_4bit_use_double_quant: also quantize the quantization constants (4-bit only).
        bnb_4bit_compute_dtype: dtype of the 4-bit matmul: a torch dtype or ``"fp32"``, ``"fp16"``,
            ``"bf16"`` (4-bit only).
        bnb_4bit_quant_storage: dtype the packed 4-bit values are stored in: ``torch.uint8`` (default)
            or ``int8``, ``float16``, ``bfloat16``, ``float32`` (4-bit only; an accel extension with
            the name transformers uses, so that FSDP can shard packed and unquantized weights together).
        torch_dtype: dtype of the layers that stay unquantized (None keeps the checkpoint's / model's).
        skip_modules: names of modules not to quantize; None picks the output head and any module tied
            to the input embedding (see ``get_keys_to_not_convert``).
        keep_in_fp32_modules: names of modules kept unquantized and in float32.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    bnb_4bit_quant_storage: Any = torch.uint8
    torch_dtype: torch.dtype | None = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None
    target_dtype: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit are both True: choose one width (8 or 4 bits).")
        if not (self.load_in_8bit or self.load_in_4bit):
            raise ValueError("Neither load_in_8bit nor load_in_4bit is True: set one of them to quantize.")
        threshold = self.llm_int8_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold < 0:
            raise ValueError(f"llm_int8_threshold must be a number >= 0, got {threshold!r}.")
        if not isinstance(self.bnb_4bit_quant_type, str) or self.bnb_4bit_quant_type not in _QUANT_TYPES:
            raise ValueError(f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {self.bnb_4bit_quant_type!r}.")
        compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        self.bnb_4bit_quant_storage = _storage_dtype(self.bnb_4bit_quant_storage)
        if self.load_in_8bit:
            wrong = [
                name for name, default in _FOUR_BIT_DEFAULTS.items() if not _same(name, getattr(self, name), default)
            ]
            if wrong:
                raise ValueError(
                    f"{', '.join(wrong)} only apply to 4-bit quantization but load_in_8bit=True: drop them, or "
                    "use load_in_4bit=True."
                )
        if self.load_in_4bit and float(threshold) != _EIGHT_BIT_DEFAULTS["llm_int8_threshold"]:
            raise ValueError(
                "llm_int8_threshold only applies to 8-bit quantization but load_in_4bit=True: drop it, or use "
                "load_in_8bit=True."
            )
        self.bnb_4bit_compute_dtype = compute_dtype
        self.llm_int8_threshold = float(threshold)
        if self.torch_dtype is not None:
            self.torch_dtype = _dtype(self.torch_dtype, "torch_dtype")
        self.skip_modules = _names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _names(self.keep_in_fp32_modules, "keep_in_fp32_modules")
        self.target_dtype = torch.int8 if self.load_in_8bit else "int4"

    @property
    def bits(self) -> int:
        """8 or 4."""
        return 8 if self.load_in_8bit else 4


def _same(name: str, value: Any, default: Any) -> bool:
    if name == "bnb_4bit_compute_dtype":
        try:
            return _dtype(value, name) == _dtype(default, name)
        except ValueError:
            return False
    return bool(value == default)

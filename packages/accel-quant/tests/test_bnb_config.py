"""BnbQuantizationConfig validates every field (pure logic: no bitsandbytes needed)."""

from __future__ import annotations

import pytest
import torch

from accel_quant.bnb_config import BnbQuantizationConfig


def test_8bit_defaults() -> None:
    config = BnbQuantizationConfig(load_in_8bit=True)
    assert config.bits == 8
    assert config.target_dtype == torch.int8
    assert config.llm_int8_threshold == 6.0
    assert config.skip_modules is None and config.keep_in_fp32_modules is None


def test_4bit_options_are_normalised() -> None:
    config = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="bf16"
    )
    assert config.bits == 4
    assert config.target_dtype == "int4"
    assert config.bnb_4bit_compute_dtype is torch.bfloat16
    assert BnbQuantizationConfig(load_in_4bit=True).bnb_4bit_compute_dtype is torch.float16
    assert (
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32).bnb_4bit_compute_dtype
        is torch.float32
    )


def test_both_widths_is_an_error() -> None:
    with pytest.raises(ValueError, match="both True: choose one width"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)


def test_no_width_is_an_error() -> None:
    with pytest.raises(ValueError, match="Neither load_in_8bit nor load_in_4bit"):
        BnbQuantizationConfig()


@pytest.mark.parametrize(
    "option",
    [
        {"bnb_4bit_quant_type": "nf4"},
        {"bnb_4bit_use_double_quant": True},
        {"bnb_4bit_compute_dtype": torch.bfloat16},
    ],
)
def test_4bit_option_with_8bit_is_an_error(option: dict) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(option))} only apply to 4-bit"):
        BnbQuantizationConfig(load_in_8bit=True, **option)


def test_8bit_threshold_with_4bit_is_an_error() -> None:
    with pytest.raises(ValueError, match="llm_int8_threshold only applies to 8-bit"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"load_in_8bit": 1}, "load_in_8bit must be True or False"),
        ({"load_in_8bit": True, "llm_int8_threshold": -1}, "llm_int8_threshold must be a number >= 0"),
        ({"load_in_8bit": True, "llm_int8_threshold": "6"}, "llm_int8_threshold must be a number"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type must be 'fp4' or 'nf4'"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp8"}, "bnb_4bit_compute_dtype must be a torch dtype"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.int8}, "bnb_4bit_compute_dtype must be torch.float32"),
        ({"load_in_4bit": True, "bnb_4bit_use_double_quant": "yes"}, "bnb_4bit_use_double_quant must be True or False"),
        ({"load_in_8bit": True, "torch_dtype": "int8"}, "torch_dtype must be a torch dtype"),
        ({"load_in_8bit": True, "skip_modules": "lm_head"}, "skip_modules must be a list of module names"),
        ({"load_in_8bit": True, "keep_in_fp32_modules": [1]}, "keep_in_fp32_modules must be a list"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BnbQuantizationConfig(**kwargs)


def test_torch_dtype_accepts_names_and_dtypes() -> None:
    assert BnbQuantizationConfig(load_in_8bit=True, torch_dtype="fp16").torch_dtype is torch.float16
    assert BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.bfloat16).torch_dtype is torch.bfloat16

"""Layer replacement and the default modules kept unquantized (bitsandbytes on CPU)."""

from __future__ import annotations

import pytest
import torch
from quant_models import TinyLM, requires_bnb
from torch import nn

from accel_bigmodel.empty import init_empty_weights
from accel_quant.bnb import get_keys_to_not_convert, name_matches, replace_with_bnb_layers
from accel_quant.bnb_config import BnbQuantizationConfig


@pytest.mark.parametrize(
    ("module", "key", "expected"),
    [
        ("head", "head", True),
        ("model.head", "head", True),
        ("blocks.0.up", "blocks.0", True),
        ("blocks.0.up", "up", True),
        ("lm_head", "head", False),
        ("blocks.10.up", "blocks.1", False),
    ],
)
def test_name_matching_uses_whole_segments(module: str, key: str, expected: bool) -> None:
    assert name_matches(module, key) is expected


def test_default_keeps_the_output_head() -> None:
    assert get_keys_to_not_convert(TinyLM()) == ["head"]


def test_default_keeps_modules_tied_to_the_embedding() -> None:
    model = TinyLM()
    model.head.weight = model.embed.weight  # tied output head, shapes (100, 64)
    assert sorted(get_keys_to_not_convert(model)) == ["embed", "head"]


def test_base_model_without_head_keeps_nothing() -> None:
    class Base(nn.Module):
        base_model_prefix = "transformer"

        def __init__(self) -> None:
            super().__init__()
            self.h = nn.Linear(4, 4)

    assert get_keys_to_not_convert(Base()) == []


@requires_bnb
def test_replacement_on_meta_model_makes_empty_bnb_layers() -> None:
    import bitsandbytes as bnb

    with init_empty_weights():
        model = TinyLM()
    replace_with_bnb_layers(model, BnbQuantizationConfig(load_in_8bit=True, llm_int8_threshold=4.0), ["head"])
    for block in model.blocks:
        assert isinstance(block.up, bnb.nn.Linear8bitLt) and isinstance(block.down, bnb.nn.Linear8bitLt)
        assert block.up.weight.device.type == "meta"
        assert block.up.state.threshold == 4.0
    assert type(model.head) is nn.Linear


@requires_bnb
def test_4bit_layers_carry_the_config() -> None:
    import bitsandbytes as bnb

    model = TinyLM()
    config = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="fp32"
    )
    replace_with_bnb_layers(model, config, ["head", "blocks.2"])
    assert isinstance(model.blocks[0].up, bnb.nn.Linear4bit)
    assert model.blocks[0].up.weight.quant_type == "nf4"
    assert model.blocks[0].up.weight.compress_statistics is True
    assert model.blocks[0].up.compute_dtype is torch.float32
    assert type(model.blocks[2].up) is nn.Linear  # skipped by a parent's name
    assert not any(p.requires_grad for p in model.blocks[0].parameters())


@requires_bnb
def test_skip_name_matching_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\['lm_head'\] match no module of TinyLM.*blocks\.0"):
        replace_with_bnb_layers(TinyLM(), BnbQuantizationConfig(load_in_8bit=True), ["lm_head"])

"""Every 4-bit setting of BnbQuantizationConfig reaches the quantized weights (read back from them).

Each test loads TinyLM from a real checkpoint into an empty model with ``load_and_quantize_model`` and
then inspects the packed weights and their quantization state: the quant type is checked by
re-quantizing the same fp32 weight by hand with bitsandbytes and comparing the packed bytes.
"""

from __future__ import annotations

import pytest
import torch
from quant_models import TinyLM, requires_bnb

from accel_bigmodel.empty import init_empty_weights
from accel_quant.bnb import load_and_quantize_model
from accel_quant.bnb_config import BnbQuantizationConfig

pytestmark = requires_bnb


def _load(checkpoint: str, **settings) -> torch.nn.Module:
    with init_empty_weights():
        empty = TinyLM()
    config = BnbQuantizationConfig(load_in_4bit=True, **settings)
    return load_and_quantize_model(empty, config, weights_location=checkpoint)


def _by_hand(weight: torch.Tensor, quant_type: str, storage: torch.dtype = torch.uint8) -> torch.Tensor:
    import bitsandbytes.functional as F

    packed, _ = F.quantize_4bit(weight.contiguous(), blocksize=64, quant_type=quant_type, quant_storage=storage)
    return packed


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_quant_type_reaches_the_packed_weights(quant_type, tiny_model, checkpoint) -> None:
    model = _load(checkpoint, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=torch.float32)
    layer = model.blocks[0].up
    weight = layer.weight
    assert weight.quant_type == quant_type and weight.quant_state.quant_type == quant_type
    source = tiny_model.blocks[0].up.weight.detach()
    assert torch.equal(weight.data, _by_hand(source, quant_type))
    other = "fp4" if quant_type == "nf4" else "nf4"
    assert not torch.equal(weight.data, _by_hand(source, other))


@pytest.mark.parametrize("double", [False, True])
def test_double_quantization_reaches_the_quant_state(double, checkpoint) -> None:
    model = _load(checkpoint, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double)
    weight = model.blocks[0].up.weight
    assert weight.compress_statistics is double
    state = weight.quant_state
    assert state.nested is double
    if double:  # the block scales are themselves quantized to 8 bits, with their own state
        assert state.absmax.dtype == torch.uint8 and state.state2 is not None
    else:
        assert state.absmax.dtype == torch.float32 and state.state2 is None


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16, "fp16"])
def test_compute_dtype_reaches_the_layer(compute, checkpoint, tokens) -> None:
    model = _load(checkpoint, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    expected = {"fp16": torch.float16}.get(compute, compute)
    for block in model.blocks:
        assert block.up.compute_dtype == expected and block.down.compute_dtype == expected


@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16, "float32"])
def test_storage_dtype_reaches_the_packed_weights(storage, tiny_model, checkpoint, tokens) -> None:
    model = _load(
        checkpoint, bnb_4bit_quant_type="nf4", bnb_4bit_quant_storage=storage, bnb_4bit_compute_dtype=torch.float32
    )
    expected = torch.float32 if storage == "float32" else storage
    weight = model.blocks[0].up.weight
    assert weight.dtype == expected and weight.quant_storage == expected
    source = tiny_model.blocks[0].up.weight.detach()
    assert torch.equal(weight.data.view(torch.uint8), _by_hand(source, "nf4", expected).view(torch.uint8))
    with torch.no_grad():
        assert torch.isfinite(model(tokens)).all()


def test_quantizing_a_model_in_memory_keeps_the_settings(tiny_model) -> None:
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    source = tiny_model.blocks[0].up.weight.detach().clone()
    model = load_and_quantize_model(tiny_model, config)
    weight = model.blocks[0].up.weight
    assert weight.quant_state.quant_type == "nf4" and weight.quant_state.nested
    assert torch.equal(weight.data, _by_hand(source, "nf4"))


def test_bad_storage_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="bnb_4bit_quant_storage"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.int64)
    with pytest.raises(ValueError, match="bnb_4bit_quant_storage"):
        BnbQuantizationConfig(load_in_8bit=True, bnb_4bit_quant_storage=torch.bfloat16)

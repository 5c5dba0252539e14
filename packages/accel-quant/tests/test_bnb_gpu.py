"""load_and_quantize_model onto a CUDA GPU: the weights are quantized where they land.

bitsandbytes' ``Int8Params.to(device)`` quantizes only when the data comes from the CPU, so a weight
loaded straight onto the GPU used to stay fp32 there (found on an H200). These tests check the packed
bytes against bitsandbytes' own quantization on the same device, the outputs, and a save/reload.
They need CUDA; CI has none.
"""

from __future__ import annotations

import pytest
import torch
from quant_models import TinyLM, requires_bnb

from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.sharding import save_sharded
from accel_quant.bnb import load_and_quantize_model
from accel_quant.bnb_config import BnbQuantizationConfig

pytestmark = [
    requires_bnb,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"),
]


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _load(checkpoint, **settings) -> torch.nn.Module:
    with init_empty_weights():
        empty = TinyLM()
    return load_and_quantize_model(empty, BnbQuantizationConfig(**settings), weights_location=checkpoint)


def test_8bit_weights_are_int8_on_the_gpu(tiny_model, tokens, checkpoint, tmp_path) -> None:
    import bitsandbytes.functional as F

    model = _load(checkpoint, load_in_8bit=True)
    weight = model.blocks[0].up.weight
    assert weight.device.type == "cuda" and weight.dtype == torch.int8 and weight.SCB is not None
    source = tiny_model.blocks[0].up.weight.detach().to("cuda", torch.float16)
    by_hand, scales, _ = F.int8_vectorwise_quant(source)
    assert torch.equal(weight.data, by_hand) and torch.equal(weight.SCB, scales)
    with torch.no_grad():
        error = _rel_error(model(tokens.cuda()), tiny_model.cuda()(tokens.cuda()))
    assert 0 < error < 0.01

    save_sharded(model.state_dict(), tmp_path / "saved")
    reloaded = _load(tmp_path / "saved", load_in_8bit=True)
    assert torch.equal(reloaded.blocks[0].up.weight.data, weight.data)
    with torch.no_grad():
        assert torch.equal(reloaded(tokens.cuda()), model(tokens.cuda()))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_weights_are_packed_on_the_gpu(quant_type, tiny_model, tokens, checkpoint) -> None:
    import bitsandbytes.functional as F

    model = _load(checkpoint, load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=torch.float32)
    weight = model.blocks[0].up.weight
    assert weight.device.type == "cuda" and weight.quant_state.quant_type == quant_type
    source = tiny_model.blocks[0].up.weight.detach().to("cuda")
    packed, _ = F.quantize_4bit(source.contiguous(), blocksize=64, quant_type=quant_type)
    assert torch.equal(weight.data, packed)
    with torch.no_grad():
        error = _rel_error(model(tokens.cuda()), tiny_model.cuda()(tokens.cuda()))
    assert 0 < error < 0.10

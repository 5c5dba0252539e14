"""TransformerEngine and MS-AMP up to the import: planning, recipe translation, missing-package errors.

Neither package installs without CUDA, so the conversions and the autocast never run here.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from quant_models import TinyLM
from torch import nn

from accel_quant.fp8.msamp import msamp_deepspeed_config, msamp_initialize
from accel_quant.fp8.recipes import TERecipe
from accel_quant.fp8.transformer_engine import (
    apply_fp8_autowrap,
    build_te_recipe,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
    plan_te_conversion,
    te_recipe_kwargs,
)

no_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine is installed"
)
no_msamp = pytest.mark.skipif(importlib.util.find_spec("msamp") is not None, reason="MS-AMP is installed")


def test_plan_converts_linear_and_layernorm_with_fp8_shapes() -> None:
    model = TinyLM(width=64, vocab=100)
    to_convert, kept = plan_te_conversion(model)
    assert to_convert["blocks.0.up"] == "Linear" and to_convert["norm"] == "LayerNorm"
    assert "head" in kept and "not multiples of 16" in kept["head"]  # 64x100
    assert "embed" not in to_convert and "embed" not in kept
    linear_only, _ = plan_te_conversion(model, convert_ln=False)
    assert "norm" not in linear_only


def test_plan_keeps_layernorm_it_cannot_take() -> None:
    model = nn.Sequential(nn.LayerNorm((4, 16)), nn.LayerNorm(16, elementwise_affine=False))
    to_convert, kept = plan_te_conversion(model)
    assert not to_convert and set(kept) == {"0", "1"}


def test_recipe_translation_delayed_scaling() -> None:
    name, kwargs, during_eval = te_recipe_kwargs(
        TERecipe(
            fp8_format="E4M3",
            margin=1,
            amax_history_len=32,
            amax_compute_algo="max",
            override_linear_precision=(False, False, True),
        )
    )
    assert name == "DelayedScaling" and during_eval is False
    assert kwargs == {
        "margin": 1,
        "interval": 1,
        "fp8_format": "E4M3",
        "amax_history_len": 32,
        "amax_compute_algo": "max",
        "override_linear_precision": (False, False, True),
    }


def test_recipe_translation_from_dict_and_handler_like_objects(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_AMAX_HISTORY_LEN", "8")
    _, kwargs, during_eval = te_recipe_kwargs({"margin": 2, "fp8_format": None, "use_autocast_during_eval": True})
    assert kwargs["margin"] == 2 and kwargs["amax_history_len"] == 8 and kwargs["fp8_format"] == "HYBRID"
    assert during_eval is True

    class Handler:  # what accel-train's TERecipeKwargs looks like: fields, None meaning unset
        def to_kwargs(self):
            return {"margin": None, "fp8_format": "E4M3", "backend": "TE", "opt_level": None}

    _, kwargs, _ = te_recipe_kwargs(Handler())
    assert kwargs["fp8_format"] == "E4M3" and kwargs["margin"] == 0


def test_recipe_translation_mxfp8() -> None:
    assert te_recipe_kwargs(TERecipe(use_mxfp8_block_scaling=True))[:2] == ("MXFP8BlockScaling", {"fp8_format": "E4M3"})


@no_te
@pytest.mark.parametrize(
    "call",
    [
        lambda: convert_model(TinyLM()),
        lambda: has_transformer_engine_layers(TinyLM()),
        lambda: build_te_recipe(None),
        lambda: apply_fp8_autowrap(TinyLM(), TERecipe()),
    ],
)
def test_te_missing_names_the_extra(call) -> None:
    with pytest.raises(ImportError, match=r"accel-quant\[transformer-engine\]"):
        call()


@no_te
def test_contextual_autocast_is_lazy_until_the_forward() -> None:
    model = nn.Linear(16, 16)
    forward = contextual_fp8_autocast(model.forward, fp8_recipe=None)
    assert forward.__wrapped__ == model.forward
    with pytest.raises(ImportError, match="transformer-engine"):
        forward(model, torch.zeros(1, 16))


@no_msamp
def test_msamp_missing_says_how_to_install() -> None:
    model = nn.Linear(16, 16)
    with pytest.raises(ImportError, match="MS-AMP from source"):
        msamp_initialize(model, torch.optim.Adam(model.parameters()), "O1")


def test_msamp_level_is_checked_before_the_import() -> None:
    model = nn.Linear(16, 16)
    with pytest.raises(ValueError, match="'O1' or 'O2'"):
        msamp_initialize(model, torch.optim.Adam(model.parameters()), "O4")


def test_msamp_deepspeed_section() -> None:
    assert msamp_deepspeed_config("O1") == {"msamp": {"enabled": True, "opt_level": "O1"}}

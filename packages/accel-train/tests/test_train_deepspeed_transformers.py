"""DeepSpeed next to transformers, with and without the ``accelerate`` package (provided by accel's
opt-in alias, ``ACCEL_PROVIDE_ACCELERATE=1``): ZeRO-3 is registered with transformers and a later
``from_pretrained`` builds the model partitioned, never against a half-built global config.

Each case runs in a fresh interpreter (transformers decides at import whether ``accelerate`` exists).
Needs transformers and DeepSpeed: the nox session ``clients`` with DeepSpeed installed runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import free_port

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (nox -s clients)"),
    pytest.mark.skipif(
        not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
    ),
]

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import transformers  # imported first, as DeepSpeed scripts do
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations import deepspeed_config, is_deepspeed_zero3_enabled
    from accel_train import Accelerator, DeepSpeedPlugin

    folder = sys.argv[1]
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(config).save_pretrained(folder)
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    accelerator.state.select_deepspeed_plugin("default")
    facts = {
        "zero3": is_deepspeed_zero3_enabled(),
        "stage": deepspeed_config()["zero_optimization"]["stage"],
        "registered": type(plugin._dschf).__module__,
    }
    model = LlamaForCausalLM.from_pretrained(folder)
    facts["partitioned"] = all(hasattr(p, "ds_id") for p in model.parameters())
    print("FACTS " + json.dumps(facts))
    """
)


def _run(tmp_path, provide: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_PROVIDE_ACCELERATE" and not k.startswith("ACCELERATE_")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if provide:
        env["ACCEL_PROVIDE_ACCELERATE"] = "1"
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("FACTS ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("FACTS "))


def test_zero3_with_transformers_without_accelerate(tmp_path) -> None:
    if importlib.util.find_spec("accelerate") is not None:
        pytest.skip("the real accelerate is installed: this case is the one without it")
    facts = _run(tmp_path, provide=False)
    # transformers' own HfDeepSpeedConfig needs accelerate: accel's config answers in its place.
    assert facts["registered"].startswith("accel_train.")
    assert (facts["zero3"], facts["stage"], facts["partitioned"]) == (True, 3, True)


def test_zero3_with_transformers_and_accelerate_provided_by_accel(tmp_path) -> None:
    if importlib.util.find_spec("accelerate") is not None:
        pytest.skip("the real accelerate is installed: accel's alias refuses to shadow it")
    facts = _run(tmp_path, provide=True)
    assert facts == {
        "zero3": True,
        "stage": 3,
        "registered": "transformers.integrations.deepspeed",
        "partitioned": True,
    }

"""The documented DeepSpeedPlugin API: ``zero_stage`` and ``is_zero3_init_enabled()`` answer from the
resolved config; one rule for ``zero3_init_flag`` below stage 3 (code and launcher); a second
Accelerator given its own plugin is refused as documented."""

from __future__ import annotations

import json
import logging

import pytest

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import reset_shared_state
from accel_train.deepspeed_plugin import DeepSpeedPlugin

needs_deepspeed = pytest.mark.skipif(
    not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
)

_LAUNCH_VARS = (
    "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
)


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def _stage3() -> dict:
    return {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}


def test_zero_stage_answers_from_a_config_dict_or_file(tmp_path) -> None:
    assert DeepSpeedPlugin(hf_ds_config=_stage3()).zero_stage == 3
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert DeepSpeedPlugin(hf_ds_config=str(path)).zero_stage == 1
    assert DeepSpeedPlugin().zero_stage == 2
    # "auto" in the file, the stage given to the plugin: the resolved value.
    auto = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": "auto"}}, zero_stage=3)
    assert auto.zero_stage == 3 and auto.deepspeed_config["zero_optimization"]["stage"] == 3


def test_is_zero3_init_enabled() -> None:
    assert DeepSpeedPlugin(hf_ds_config=_stage3()).is_zero3_init_enabled() is True
    assert DeepSpeedPlugin(hf_ds_config=_stage3(), zero3_init_flag=False).is_zero3_init_enabled() is False
    assert DeepSpeedPlugin(zero_stage=2).is_zero3_init_enabled() is False


def test_zero3_init_flag_below_stage_3_is_one_rule_for_code_and_launcher(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        from_code = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert from_code.zero3_init_flag is False and not from_code.is_zero3_init_enabled()
    assert "zero3_init_flag applies to ZeRO stage 3 only (stage is 2)" in caplog.text
    caplog.clear()
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    with caplog.at_level(logging.WARNING):
        from_launcher = DeepSpeedPlugin()
    assert from_launcher.zero3_init_flag is False
    assert "zero3_init_flag applies to ZeRO stage 3 only (stage is 2)" in caplog.text


@needs_deepspeed
def test_zero_stage_after_the_accelerator() -> None:
    from accel_train import Accelerator

    reset_shared_state()
    plugin = DeepSpeedPlugin(hf_ds_config=_stage3())
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    assert accelerator.state.deepspeed_plugin.zero_stage == 3
    assert accelerator.state.deepspeed_plugin.is_zero3_init_enabled()
    reset_shared_state()


@needs_deepspeed
def test_a_second_accelerator_with_its_own_plugin_is_refused() -> None:
    from accel_train import Accelerator

    reset_shared_state()
    first = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    with pytest.raises(NotImplementedError, match="cannot be given to a second Accelerator.*select_deepspeed_plugin"):
        Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    # As documented: the second Accelerator takes no arguments and shares the plugins.
    second = Accelerator(cpu=True)
    assert second.state.deepspeed_plugin is first.state.deepspeed_plugin
    assert second.state.deepspeed_plugin.zero_stage == 2
    reset_shared_state()


def test_zero_stage_as_a_string_means_the_stage() -> None:
    # The documented system takes "zero2"; accel reads it (and "2") as the stage number DeepSpeed expects.
    for given, stage in (("zero2", 2), ("ZeRO3", 3), ("zero0", 0), ("1", 1), (2, 2)):
        plugin = DeepSpeedPlugin(zero_stage=given)
        assert plugin.zero_stage == stage and plugin.deepspeed_config["zero_optimization"]["stage"] == stage
    for wrong in ("zero4", "two", 2.0, True):
        with pytest.raises(ValueError, match=r"zero_stage=.* is not valid; choose one of \[0, 1, 2, 3\].*'zero2'"):
            DeepSpeedPlugin(zero_stage=wrong)


def test_deepspeed_config_is_set_by_prepare_only() -> None:
    from accel_train import Accelerator

    reset_shared_state()
    accelerator = Accelerator(cpu=True)
    assert not hasattr(accelerator, "deepspeed_config")
    with pytest.raises(AttributeError, match="set by `accelerator.prepare.*under DeepSpeed"):
        _ = accelerator.deepspeed_config
    reset_shared_state()

"""``DeepSpeedSequenceParallelConfig`` and its wiring (one process): fields parsed once from code or the
launcher's variables, named errors, ``ParallelismConfig(sp_size=...)`` under DeepSpeed only, the model
checks run before Ulysses is registered, and the exported names. The two-process run is in
``test_train_deepspeed_ulysses.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import reset_shared_state
from accel_train.strategies.deepspeed.sequence_parallel import DeepSpeedSequenceParallelConfig, check_model
from accel_train.strategies.nd.config import ParallelismConfig

needs_deepspeed = pytest.mark.skipif(
    not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
)

_VARS = (
    "PARALLELISM_CONFIG_SP_SIZE",
    "PARALLELISM_CONFIG_SP_BACKEND",
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH",
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE",
    "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
    "ACCELERATE_USE_PARALLELISM_CONFIG",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_MIXED_PRECISION",
)


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_the_documented_ones() -> None:
    config = DeepSpeedSequenceParallelConfig()
    assert (config.sp_seq_length, config.sp_seq_length_is_variable, config.sp_attn_implementation) == (
        None,
        True,
        "sdpa",
    )
    assert config.local_seq_length(2) is None  # variable lengths: shapes come from each batch


def test_fields_left_unset_take_the_launcher_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "256")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", "flash_attention_2")
    config = DeepSpeedSequenceParallelConfig()
    assert (config.sp_seq_length, config.sp_seq_length_is_variable, config.sp_attn_implementation) == (
        256,
        False,
        "flash_attention_2",
    )
    assert config.local_seq_length(4) == 64
    # code wins over the launcher
    assert DeepSpeedSequenceParallelConfig(sp_seq_length=128, sp_attn_implementation="sdpa").sp_seq_length == 128
    # the launcher writes "None" for a length left unset
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "None")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true")
    assert DeepSpeedSequenceParallelConfig().sp_seq_length is None


def test_a_fixed_length_needs_the_length() -> None:
    with pytest.raises(ValueError, match=r"sp_seq_length_is_variable=False needs the fixed length.*sp_seq_length="):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    with pytest.raises(ValueError, match=r"sp_seq_length=100 is not divisible by sp_size=3"):
        DeepSpeedSequenceParallelConfig(sp_seq_length=100, sp_seq_length_is_variable=False).local_seq_length(3)


@pytest.mark.parametrize("bad", [0, -4, "abc", 2.5])
def test_a_length_that_is_not_a_positive_integer_is_named(bad) -> None:
    with pytest.raises(ValueError, match=r"sp_seq_length must be a positive number of tokens"):
        DeepSpeedSequenceParallelConfig(sp_seq_length=bad)


def test_a_flag_that_is_not_a_bool_is_named() -> None:
    with pytest.raises(ValueError, match=r"sp_seq_length_is_variable must be True or False, got 'yes'"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable="yes")


@pytest.mark.parametrize(
    ("name", "why"),
    [("eager", "full 4-D attention mask"), ("flex_attention", "does not wrap it"), ("my_attention", "not one")],
)
def test_attention_implementations_ulysses_cannot_wrap_are_named(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"sp_attn_implementation='{name}'.*{why}.*sdpa"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation=name)


def test_hub_flash_attention_kernels_are_accepted() -> None:
    config = DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")
    assert config.sp_attn_implementation == "kernels-community/flash-attn2"


# -- ParallelismConfig -----------------------------------------------------------------------------------


def test_parallelism_config_builds_the_handler_and_skips_the_torch_mesh() -> None:
    config = ParallelismConfig(sp_size=2)
    assert isinstance(config.sp_handler, DeepSpeedSequenceParallelConfig)
    assert (config.sp_backend, config.sp_enabled, config.sequence_parallel_by_deepspeed) == ("deepspeed", True, True)
    assert config.total_size == 2 and config.data_parallel_size == 1 and not config.is_trivial
    assert config.build_device_mesh("cpu") is None  # DeepSpeed builds the sequence-parallel groups itself
    assert ParallelismConfig().sp_handler is None


def test_parallelism_config_reads_the_launcher_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "64")
    config = ParallelismConfig()
    assert config.sp_size == 4 and config.sp_handler.sp_seq_length == 64


def test_parallelism_config_errors_are_named() -> None:
    with pytest.raises(ValueError, match=r"sp_backend='torch' is not valid.*sp_backend='deepspeed'"):
        ParallelismConfig(sp_size=2, sp_backend="torch")
    with pytest.raises(ValueError, match=r"cp_size=2 and sp_size=2.*set one of them to 1"):
        ParallelismConfig(sp_size=2, cp_size=2)
    with pytest.raises(TypeError, match=r"sp_handler must be a DeepSpeedSequenceParallelConfig.*got dict"):
        ParallelismConfig(sp_size=2, sp_handler={"sp_seq_length": 8})
    with pytest.raises(ValueError, match=r"sp_size must be an int >= 1"):
        ParallelismConfig(sp_size=0)


# -- the model checks --------------------------------------------------------------------------------


def _model(**config):
    fields = {"num_attention_heads": 4, "num_key_value_heads": 2, "_attn_implementation": "sdpa"}
    fields.update(config)
    return SimpleNamespace(config=SimpleNamespace(**fields))


def test_model_checks_name_what_ulysses_cannot_run() -> None:
    handler = DeepSpeedSequenceParallelConfig()
    check_model(_model(), handler, 2)  # a model it runs
    with pytest.raises(ValueError, match=r"has no transformers `config`.*PreTrainedModel"):
        check_model(torch.nn.Linear(2, 2), handler, 2)
    with pytest.raises(ValueError, match=r"attn_implementation='eager' but sequence parallelism wraps.*'sdpa'"):
        check_model(_model(_attn_implementation="eager"), handler, 2)
    with pytest.raises(ValueError, match=r"6 attention heads, which do not split over sp_size=4"):
        check_model(_model(num_attention_heads=6, num_key_value_heads=6), handler, 4)
    with pytest.raises(ValueError, match=r"3 key/value heads and sp_size=2"):
        check_model(_model(num_attention_heads=6, num_key_value_heads=3), handler, 2)
    with pytest.raises(ValueError, match=r"\['linear_attention'\] carry a state along the sequence"):
        check_model(_model(layer_types=["full_attention", "linear_attention"]), handler, 2)


# -- the Accelerator -----------------------------------------------------------------------------------


def test_sequence_parallelism_without_deepspeed_is_refused() -> None:
    reset_shared_state()
    from accel_train import Accelerator

    with pytest.raises(ValueError, match=r"sp_size=2\) is sequence parallelism through DeepSpeed.*DeepSpeedPlugin"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2))
    reset_shared_state()


@needs_deepspeed
def test_sequence_parallelism_needs_a_multiple_of_sp_size_processes() -> None:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    with pytest.raises(ValueError, match=r"sp_size=2\) splits each sequence over 2 ranks, but the run has 1"):
        Accelerator(
            cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=1), parallelism_config=ParallelismConfig(sp_size=2)
        )
    reset_shared_state()


def test_the_config_is_exported_from_accel_train() -> None:
    # The documented module paths (accel.utils, accel.parallelism_config) are the meta-package's
    # to test: accel-train's suite runs without it installed.
    import accel_train

    assert accel_train.DeepSpeedSequenceParallelConfig is DeepSpeedSequenceParallelConfig

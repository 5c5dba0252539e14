"""The launch flags of the documented system that accel added for ported scripts (the extended
Megatron-LM settings, the context/sequence parallel ones): parsed, read from config files, and passed
to the processes in the documented variables."""

from __future__ import annotations

from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve

GPU4 = MachineInfo("cuda", 4, 32)


def plan_of(argv: list[str], config: dict | None = None):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config) if config is not None else None
    return resolve(given_flags(args), cfg, GPU4, args.training_script, args.training_script_args)


def test_extended_megatron_flags_reach_the_environment() -> None:
    plan = plan_of(
        [
            "--use_megatron_lm",
            "--megatron_lm_attention_dropout",
            "0.1",
            "--megatron_lm_recompute_granularity",
            "selective",
            "--megatron_lm_expert_model_parallel_size",
            "2",
            "--megatron_lm_use_rotary_position_embeddings",
            "true",
            "--megatron_lm_no_save_optim",
            "false",
        ]
    )
    env = plan.env
    assert env["MEGATRON_LM_ATTENTION_DROPOUT"] == "0.1"
    assert env["MEGATRON_LM_RECOMPUTE_GRANULARITY"] == "selective"
    assert env["MEGATRON_LM_EXPERT_MODEL_PARALLEL_SIZE"] == "2"
    assert env["MEGATRON_LM_USE_ROTARY_POSITION_EMBEDDINGS"] == "true"
    assert env["MEGATRON_LM_NO_SAVE_OPTIM"] == "false"
    assert "MEGATRON_LM_HIDDEN_DROPOUT" not in env  # unset flags stay unset


def test_sequence_and_context_parallel_flags_and_config_keys() -> None:
    plan = plan_of(
        [
            "--use_parallelism_config",
            "--parallelism_config_sp_size",
            "2",
            "--parallelism_config_sp_seq_length",
            "1024",
            "--parallelism_config_sp_attn_implementation",
            "flash_attention_2",
        ]
    )
    env = plan.env
    assert env["PARALLELISM_CONFIG_SP_SIZE"] == "2" and env["PARALLELISM_CONFIG_SP_BACKEND"] == "deepspeed"
    assert env["PARALLELISM_CONFIG_CP_BACKEND"] == "torch"
    assert env["PARALLELISM_CONFIG_SP_SEQ_LENGTH"] == "1024"
    assert env["PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE"] == "true"
    assert env["PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"] == "flash_attention_2"
    without_sp = plan_of(["--use_parallelism_config"]).env
    assert without_sp["PARALLELISM_CONFIG_SP_SIZE"] == "1" and "PARALLELISM_CONFIG_SP_SEQ_LENGTH" not in without_sp


def test_config_file_keys_of_the_new_settings_are_accepted() -> None:
    config = {
        "distributed_type": "MEGATRON_LM",
        "num_processes": 4,
        "megatron_lm_config": {"megatron_lm_attention_backend": "flash", "megatron_lm_hidden_dropout": 0.05},
        "parallelism_config": {"parallelism_config_sp_backend": "deepspeed", "parallelism_config_cp_backend": "torch"},
    }
    plan = plan_of([], config)
    assert plan.env["MEGATRON_LM_ATTENTION_BACKEND"] == "flash"
    assert plan.env["MEGATRON_LM_HIDDEN_DROPOUT"] == "0.05"


def test_a_bad_choice_names_the_valid_ones() -> None:
    import pytest

    with pytest.raises(SystemExit):
        launch_command_parser().parse_args(["--parallelism_config_cp_backend", "ring", "train.py"])

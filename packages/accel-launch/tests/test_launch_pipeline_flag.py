"""The pipeline-parallel size (an accel extension) from a flag or a config key to the processes."""

from __future__ import annotations

from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve
from accel_state import env_vars

CPU = MachineInfo("cpu", 0, 8)


def _plan(argv: list[str], config: dict | None = None):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config) if config is not None else None
    return resolve(given_flags(args), cfg, CPU, args.training_script, args.training_script_args)


def test_pp_size_flag_and_config_key_reach_the_processes() -> None:
    plan = _plan(["--use_parallelism_config", "--parallelism_config_pp_size", "2", "--num_processes", "4"])
    assert env_vars.read("PARALLELISM_CONFIG_PP_SIZE", plan.env) == 2
    config = {
        "distributed_type": "MULTI_CPU",
        "num_processes": 2,
        "parallelism_config": {"parallelism_config_pp_size": 2},
    }
    plan = _plan(["--use_parallelism_config"], config)
    assert env_vars.read("PARALLELISM_CONFIG_PP_SIZE", plan.env) == 2
    assert env_vars.read("PARALLELISM_CONFIG_PP_SIZE", _plan(["--use_parallelism_config"]).env) == 1

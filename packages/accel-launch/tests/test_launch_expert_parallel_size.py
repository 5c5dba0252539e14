"""The expert-parallel size from a flag, a config key or `accel config` to the processes, and its checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accel_launch.commands.config.config_args import config_from_dict, load_config_from_file
from accel_launch.commands.config.update import update_config
from accel_launch.commands.env import environment_info, format_info
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.options import G_PARALLELISM, OPTIONS
from accel_launch.parallel_sizes import SIZE_OPTIONS, product_warning
from accel_launch.plan import MachineInfo, resolve
from accel_launch.values import ConfigError
from accel_state import env_vars

CPU = MachineInfo("cpu", 0, 8)


def _plan(argv: list[str], config: dict | None = None):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config, source="cfg.yaml") if config is not None else None
    return resolve(given_flags(args), cfg, CPU, args.training_script, args.training_script_args)


def _config(**section: object) -> dict:
    return {"distributed_type": "MULTI_CPU", "num_processes": 4, "parallelism_config": section}


def test_ep_size_flag_reaches_the_processes() -> None:
    plan = _plan(
        [
            "--use_parallelism_config",
            "--num_processes",
            "4",
            "--parallelism_config_dp_shard_size",
            "2",
            "--parallelism_config_ep_size",
            "2",
        ]
    )
    assert env_vars.read("PARALLELISM_CONFIG_EP_SIZE", plan.env) == 2
    assert plan.env["PARALLELISM_CONFIG_EP_SIZE"] == "2"
    assert plan.warnings == ()  # 2 x 2 is the 4 processes
    default = _plan(["--use_parallelism_config"]).env
    assert default["PARALLELISM_CONFIG_EP_SIZE"] == "1"
    assert "PARALLELISM_CONFIG_EP_SIZE" not in _plan(["--num_processes", "2"]).env  # no ParallelismConfig


def test_ep_size_config_key_reaches_the_processes_and_a_flag_wins() -> None:
    config = _config(parallelism_config_dp_shard_size=2, parallelism_config_ep_size=2)
    plan = _plan([], config)  # the section turns ParallelismConfig on by itself
    assert plan.env["PARALLELISM_CONFIG_EP_SIZE"] == "2"
    assert plan.sources["parallelism_config_ep_size"] == "config file cfg.yaml"
    plan = _plan(["--parallelism_config_ep_size", "4", "--parallelism_config_dp_shard_size", "1"], config)
    assert plan.env["PARALLELISM_CONFIG_EP_SIZE"] == "4"


def test_ep_size_without_use_parallelism_config_is_named_as_ignored() -> None:
    plan = _plan(["--parallelism_config_ep_size", "2"])
    assert "PARALLELISM_CONFIG_EP_SIZE" not in plan.env
    assert any("--parallelism_config_ep_size 2 is ignored" in warning for warning in plan.warnings)


def test_a_non_integer_ep_size_flag_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        launch_command_parser().parse_args(["--parallelism_config_ep_size", "two", "train.py"])
    error = capsys.readouterr().err
    assert "--parallelism_config_ep_size" in error and "invalid int value: 'two'" in error


def test_a_non_integer_ep_size_config_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"parallelism_config_ep_size.*'two'"):
        config_from_dict(_config(parallelism_config_ep_size="two"), source="cfg.yaml")


@pytest.mark.parametrize("size", ["0", "-2"])
def test_an_ep_size_flag_below_one_is_refused_by_name(size: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--parallelism_config_ep_size must be .* at least 1 .*got {size}$"):
        _plan(["--use_parallelism_config", f"--parallelism_config_ep_size={size}"])


def test_an_ep_size_config_key_below_one_is_refused_with_its_file() -> None:
    with pytest.raises(ConfigError, match=r"^parallelism_config_ep_size \(config file cfg.yaml\) must be .*got 0$"):
        _plan([], _config(parallelism_config_ep_size=0))


def test_other_sizes_below_one_are_refused_too() -> None:
    with pytest.raises(ConfigError, match=r"^--parallelism_config_tp_size must be .*got 0$"):
        _plan(["--parallelism_config_tp_size", "0"])  # wrong even where it is ignored


def test_the_product_counts_ep_and_a_mismatch_is_named() -> None:
    argv = ["--use_parallelism_config", "--parallelism_config_ep_size", "2", "--parallelism_config_tp_size", "2"]
    plan = _plan([*argv, "--num_processes", "2"])
    assert plan.warnings == (
        "the parallelism sizes multiply to 4 (ep 2 x tp 2) but the run has 2 processes: the Accelerator "
        "refuses this unless the script's ParallelismConfig(...) sets sizes that multiply to the process count",
    )
    assert _plan([*argv, "--num_processes", "4"]).warnings == ()
    eight = _plan([*argv, "--num_processes", "8", "--parallelism_config_dp_shard_size", "2"])
    assert eight.warnings == ()  # dp_shard 2 x ep 2 x tp 2
    assert "multiply to 2 (ep 2)" in _plan([*argv[:3], "--num_processes", "4"]).warnings[0]


def test_the_product_is_not_checked_where_processes_form_no_group() -> None:
    values = {"use_parallelism_config": True, "parallelism_config_ep_size": 2}
    assert product_warning(values, 4, "torchrun") is not None
    assert product_warning(values, 4, "copies") is None  # each copy is a world of its own
    assert product_warning({**values, "use_parallelism_config": False}, 4, "torchrun") is None


def test_every_size_of_the_options_table_is_in_the_product() -> None:
    sizes = {option.dest for option in OPTIONS if option.group == G_PARALLELISM and option.dest.endswith("_size")}
    assert set(SIZE_OPTIONS) == sizes


def test_config_update_and_env_keep_and_show_ep_size(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_config(parallelism_config_dp_shard_size=2, parallelism_config_ep_size=2)))
    update_config(str(path))
    written = yaml.safe_load(path.read_text())
    assert written["parallelism_config"]["parallelism_config_ep_size"] == 2
    assert load_config_from_file(str(path)).parallelism_config["parallelism_config_ep_size"] == 2
    text = format_info(environment_info(str(path)))
    assert "parallelism_config_ep_size': 2" in text


def test_ep_flag_is_listed_in_the_parallelism_help_group() -> None:
    parser = launch_command_parser()
    groups = {group.title: group for group in parser._action_groups}
    dests = [action.dest for action in groups[G_PARALLELISM]._group_actions]
    assert dests.index("parallelism_config_ep_size") == dests.index("parallelism_config_tp_size") + 1

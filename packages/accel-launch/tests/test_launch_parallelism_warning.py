"""`--parallelism_config_*` without `--use_parallelism_config`: still ignored, but said (issue 37)."""

from __future__ import annotations

import json

from launch_helpers import run_cli

from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.ignored_settings import ignored_parallelism_settings
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve

CPU = MachineInfo("cpu", 0, 8)


def _plan(argv: list[str], config: dict | None = None):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config, source="cfg.yaml") if config is not None else None
    return resolve(given_flags(args), cfg, CPU, args.training_script, args.training_script_args)


def _parallelism_warnings(plan) -> list[str]:
    return [w for w in plan.warnings if "use_parallelism_config" in w]


def test_flags_without_use_parallelism_config_are_ignored_with_one_warning() -> None:
    plan = _plan(["--num_processes", "2", "--parallelism_config_pp_size", "2", "--parallelism-config-tp-size", "2"])
    assert not plan.values["use_parallelism_config"]
    assert not any(key.startswith("PARALLELISM_CONFIG") for key in plan.env)  # still ignored, as documented
    (warning,) = _parallelism_warnings(plan)
    assert "\n" not in warning
    assert "--parallelism_config_pp_size 2" in warning and "--parallelism_config_tp_size 2" in warning
    assert "ignored without --use_parallelism_config" in warning
    assert "cp_size" not in warning and "dp_shard_size" not in warning  # defaults are not named


def test_a_flag_given_at_its_default_value_is_still_named() -> None:
    (warning,) = _parallelism_warnings(_plan(["--parallelism_config_cp_comm_strategy", "allgather"]))
    assert warning.startswith("--parallelism_config_cp_comm_strategy allgather is ignored")


def test_no_warning_with_use_parallelism_config_or_without_such_flags() -> None:
    used = _plan(["--use_parallelism_config", "--parallelism_config_pp_size", "2", "--num_processes", "2"])
    assert _parallelism_warnings(used) == [] and used.env["PARALLELISM_CONFIG_PP_SIZE"] == "2"
    assert _parallelism_warnings(_plan(["--num_processes", "2", "--mixed_precision", "bf16"])) == []
    assert _parallelism_warnings(_plan(["--use_parallelism_config"])) == []


def test_a_config_file_section_turns_the_settings_on_so_nothing_is_ignored() -> None:
    section = {
        "distributed_type": "MULTI_CPU",
        "num_processes": 2,
        "parallelism_config": {"parallelism_config_tp_size": 2},
    }
    plan = _plan([], section)
    assert plan.values["use_parallelism_config"] and _parallelism_warnings(plan) == []
    # Flags on top of such a file are used too; a file without the section sets none of them.
    assert _parallelism_warnings(_plan(["--parallelism_config_pp_size", "2"], section)) == []
    plain = {"distributed_type": "MULTI_CPU", "num_processes": 2}
    assert _parallelism_warnings(_plan([], plain)) == []
    (warning,) = _parallelism_warnings(_plan(["--parallelism_config_pp_size", "2"], plain))
    assert "--parallelism_config_pp_size 2" in warning


def test_values_from_a_config_file_are_named_with_their_file() -> None:
    values = {"use_parallelism_config": False, "parallelism_config_tp_size": 2, "parallelism_config_pp_size": 1}
    sources = {"parallelism_config_tp_size": "config file cfg.yaml", "parallelism_config_pp_size": "default"}
    warning = ignored_parallelism_settings(values, sources)
    assert warning is not None and warning.startswith("parallelism_config_tp_size: 2 (config file cfg.yaml) is")
    assert "pp_size" not in warning
    assert ignored_parallelism_settings({**values, "use_parallelism_config": True}, sources) is None


def test_the_launcher_warns_on_stderr_and_the_dry_run_shows_the_note(tmp_path, config_home) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    argv = ["launch", "--cpu", "--num_processes", "2", "--parallelism_config_pp_size", "2", "--dry_run"]
    shown = run_cli([*argv, str(script)], env={"HF_HOME": str(config_home)})
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stderr.splitlines() if "use_parallelism_config" in line]
    assert lines == [
        "accel launch: warning: --parallelism_config_pp_size 2 is ignored without --use_parallelism_config: "
        "add --use_parallelism_config to build a ParallelismConfig from it"
    ]
    assert "  warning: --parallelism_config_pp_size 2 is ignored without --use_parallelism_config" in shown.stdout
    assert "strategy:              DDP" in shown.stdout
    as_json = run_cli([*argv, "--json", str(script)], env={"HF_HOME": str(config_home)})
    assert any("--use_parallelism_config" in w for w in json.loads(as_json.stdout)["warnings"])
    used = run_cli([*argv, "--use_parallelism_config", str(script)], env={"HF_HOME": str(config_home)})
    assert used.returncode == 0 and "use_parallelism_config" not in used.stderr

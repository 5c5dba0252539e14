"""Launcher behaviours scripts written for the documented system (release 1.15) rely on (issue 17)."""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path
from unittest import mock

import pytest
from launch_helpers import run_cli

from accel_launch import launch_utils
from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.commands_build import mpirun_command
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve
from accel_launch.runner import choose_port, launch_env
from accel_launch.values import ConfigError

CPU = MachineInfo("cpu", 0, 8)


def plan_of(argv: list[str], config: dict | None = None):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config) if config is not None else None
    return resolve(given_flags(args), cfg, CPU, args.training_script, args.training_script_args)


# -- item 9: --main_process_port 0 ----------------------------------------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_port_zero_picks_a_free_port() -> None:
    plan = plan_of(["--cpu", "--num_processes", "2", "--main_process_port", "0"])
    assert plan.main_process_port == 0 and not plan.port_given
    port = choose_port(plan)
    assert 0 < port < 65536 and not _listening(port)
    with pytest.raises(ConfigError, match="other machines cannot know"):
        plan_of(["--cpu", "--num_processes", "2", "--num_machines", "2", "--main_process_ip", "10.0.0.1",
                 "--main_process_port", "0"])  # fmt: skip
    with pytest.raises(ConfigError, match="or 0 to pick a free one"):
        plan_of(["--main_process_port", "-1"])


def test_launcher_helpers_report_the_port_they_chose() -> None:
    args = launch_command_parser().parse_args(["--cpu", "--num_processes", "2", "--main_process_port", "0", "t.py"])
    env = launch_utils.prepare_multi_gpu_env(args)
    assert args.main_process_port > 0
    assert env["MASTER_PORT"] == str(args.main_process_port) == args.master_port
    assert f"--master_port {args.main_process_port}" in env["ACCEL_TORCHRUN_ARGS"]
    default = launch_command_parser().parse_args(["--cpu", "--num_processes", "2", "t.py"])
    launch_utils.prepare_multi_gpu_env(default)
    assert default.main_process_port == 29500


# -- item 13: .deepspeed_env lines and boolean flags ----------------------------------------------


def test_convert_dict_to_env_variables_drops_unsafe_entries_in_order(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "B_OK": "2",
        "SEMI": "a;b",
        "A_OK": "1",
        "LT": "<x",
        "GT": "x>",
        "SPACE": "a b",
        "NEWLINE": "a\nb",
        "EMPTY": "",
        "C_OK": "3",
    }
    with caplog.at_level(logging.WARNING):
        lines = launch_utils.convert_dict_to_env_variables(env)
    assert lines == ["B_OK=2\n", "A_OK=1\n", "C_OK=3\n"]
    skipped = [name for name in ("SEMI", "LT", "GT", "SPACE", "NEWLINE", "EMPTY") if name in caplog.text]
    assert len(skipped) == 6


def test_boolean_launch_flags_default_to_false() -> None:
    args = launch_command_parser().parse_args(["t.py"])
    for name in ("debug", "cpu", "multi_gpu", "use_deepspeed", "use_fsdp", "module", "no_python", "quiet"):
        assert getattr(args, name) is False, name
    assert args.num_processes is None  # valued flags still say "not given"
    assert given_flags(args) == {}
    assert given_flags(launch_command_parser().parse_args(["--debug", "t.py"])) == {"debug": True}
    # A namespace built by hand with False switches means the same as not giving them.
    manual = argparse.Namespace(cpu=False, debug=False, num_processes=2, training_script="t.py")
    assert launch_utils.plan_from_args(manual, machine=CPU).values["debug"] is False


# -- item 14: exported ACCELERATE_* settings survive ----------------------------------------------


def test_exported_settings_are_kept_unless_a_flag_or_the_config_sets_them() -> None:
    exported = {"ACCELERATE_DEBUG_MODE": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}
    plan = plan_of(["--cpu"])
    env = launch_env(plan, exported)
    assert "ACCELERATE_DEBUG_MODE" not in env and "ACCELERATE_MIXED_PRECISION" not in env  # inherited as exported
    assert env["ACCELERATE_USE_CPU"] == "true"  # chosen by a flag
    flagged = launch_env(plan_of(["--cpu", "--mixed_precision", "fp16"]), exported)
    assert flagged["ACCELERATE_MIXED_PRECISION"] == "fp16"
    configured = launch_env(plan_of([], {"debug": False, "mixed_precision": "no", "use_cpu": True}), exported)
    assert configured["ACCELERATE_DEBUG_MODE"] == "false" and configured["ACCELERATE_MIXED_PRECISION"] == "no"
    # Nothing exported: the launcher's defaults are written as before.
    assert launch_env(plan, {})["ACCELERATE_DEBUG_MODE"] == "false"


def test_accel_launch_keeps_an_exported_debug_mode(tmp_path: Path, config_home: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('DEBUG=' + os.environ['ACCELERATE_DEBUG_MODE'])\n")
    kept = run_cli(["launch", "--cpu", str(script)], env={"HF_HOME": str(config_home), "ACCELERATE_DEBUG_MODE": "1"})
    assert kept.returncode == 0, kept.stderr
    assert "DEBUG=1" in kept.stdout


# -- names: accel.utils.launch exposes `which` and `subprocess` ------------------------------------


def test_mpirun_spelling_follows_the_mpi_found() -> None:
    with mock.patch.object(
        launch_utils, "which", side_effect=lambda name: "/usr/bin/mpirun" if name == "mpirun" else None
    ):
        with mock.patch.object(launch_utils.subprocess, "check_output", return_value=b"mpirun (Open MPI) 4.1.2"):
            assert launch_utils.mpirun_spelling() == ("mpirun", "--hostfile", "-n", "--npernode", "--bind-to")
        with mock.patch.object(launch_utils.subprocess, "check_output", return_value=b"Intel(R) MPI Library"):
            spelling = launch_utils._get_mpirun_args()
            assert spelling == ("mpirun", "-f", "-n", "-ppn", "")
    plan = plan_of(["--cpu", "--num_processes", "4", "--mpirun_hostfile", "hosts"])
    assert mpirun_command(plan, ("mpiexec", "--hostfile", "-n", "--npernode", "--bind-to"))[:3] == [
        "mpiexec",
        "--hostfile",
        "hosts",
    ]
    with mock.patch.object(launch_utils, "which", return_value=None):
        with pytest.raises(OSError, match="mpirun nor mpiexec"):
            launch_utils.mpirun_spelling()


# -- names: to-fsdp2 and every FSDP key the documented system writes ----------------------------


def test_to_fsdp2_accepts_every_fsdp_key_the_documented_system_writes(tmp_path: Path) -> None:
    import yaml

    from accel_launch.commands import to_fsdp2

    fsdp1 = {
        "fsdp_activation_checkpointing": False,
        "fsdp_activation_checkpointing_offload": True,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_forward_prefetch": False,
        "fsdp_ignored_modules": "vision_tower.*",
        "fsdp_min_num_params": 0,
        "fsdp_offload_params": False,
        "fsdp_sharding_strategy": "FULL_SHARD",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_sync_module_states": True,
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_use_orig_params": True,
        "fsdp_version": 1,
    }
    source = tmp_path / "fsdp1.yaml"
    source.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": fsdp1}))
    assert to_fsdp2.load_config(str(source))["fsdp_config"] == fsdp1
    target = tmp_path / "fsdp2.yaml"
    assert (
        to_fsdp2.to_fsdp2_command(
            to_fsdp2.to_fsdp2_command_parser().parse_args(["--config_file", str(source), "--output_file", str(target)])
        )
        == 0
    )
    converted = yaml.safe_load(target.read_text())["fsdp_config"]
    assert converted["fsdp_ignored_modules"] == "vision_tower.*"
    assert converted["fsdp_activation_checkpointing_offload"] is True
    assert converted["fsdp_reshard_after_forward"] is True and converted["fsdp_version"] == 2
    assert to_fsdp2.convert_config_to_fsdp2({"fsdp_config": fsdp1})["fsdp_config"] == converted
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        to_fsdp2.load_config(str(empty))


def test_the_launcher_carries_the_extra_fsdp_keys() -> None:
    plan = plan_of(
        ["--use_fsdp", "--num_processes", "2", "--fsdp_ignored_modules", "head.*"],
        {"fsdp_config": {"fsdp_activation_checkpointing_offload": True}},
    )
    assert plan.env["FSDP_IGNORED_MODULES"] == "head.*"
    assert plan.env["FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"] == "true"


def test_documented_command_function_names() -> None:
    from accel_launch.commands import to_fsdp2

    parser = to_fsdp2.to_fsdp2_command_parser()
    assert parser.parse_args(["--config_file", "c.yaml", "--overwrite"]).overwrite is True

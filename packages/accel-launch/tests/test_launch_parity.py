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

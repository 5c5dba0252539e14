"""Argument errors of the `accel` command are short and suggest the flag meant (issue 37)."""

from __future__ import annotations

import pytest
from launch_helpers import run_cli

from accel_launch.arg_errors import TORCHRUN_NAMES, suggest_options
from accel_launch.cli import main
from accel_launch.launch_args import launch_command_parser


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_an_invalid_choice_prints_a_short_usage_and_the_error() -> None:
    shown = run_cli(["launch", "--mixed_precision", "bf61", "x.py"])
    assert shown.returncode == 2
    lines = shown.stderr.splitlines()
    assert len(lines) < 6, shown.stderr
    assert lines[0] == "usage: accel launch [-h] [options] training_script [training_script_args ...]"
    assert "accel launch: error: argument --mixed_precision" in shown.stderr
    assert "invalid choice: 'bf61'" in shown.stderr
    assert "`accel launch -h`" in shown.stderr
    assert "--num_processes" not in shown.stderr  # no option list


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--nproc_per_node", "--num_processes"),
        ("--nproc-per-node=2", "--num_processes"),
        ("--nnodes", "--num_machines"),
        ("--node_rank", "--machine_rank"),
        ("--master_addr", "--main_process_ip"),
        ("--master_port", "--main_process_port"),
        ("--num_processs", "--num_processes"),
        ("--mixed-precison", "--mixed_precision"),
    ],
)
def test_an_unknown_launch_flag_suggests_the_closest(typed: str, meant: str) -> None:
    assert suggest_options(typed, launch_command_parser())[0] == meant


def test_torchrun_names_map_to_flags_the_launcher_has() -> None:
    known = {flag for action in launch_command_parser()._actions for flag in action.option_strings}
    for name in TORCHRUN_NAMES.values():
        assert f"--{name}" in known


def test_nothing_close_suggests_nothing() -> None:
    assert suggest_options("--zzzz", launch_command_parser()) == []
    assert suggest_options("train.py", launch_command_parser()) == []


def test_unknown_flags_of_launch_are_reported_by_launch_with_did_you_mean(capsys) -> None:
    # (argparse takes the "2" after an unknown flag for the script, so the flags come first here)
    err = _error(["launch", "--nproc_per_node", "--num_processs", "x.py"], capsys)
    assert len(err.splitlines()) < 6, err
    assert "usage: accel launch [-h]" in err
    assert "accel launch: error: unrecognized arguments: --nproc_per_node (did you mean --num_processes?" in err
    assert "torchrun's name" in err
    assert "--num_processs (did you mean --num_processes?)" in err


def test_other_sub_commands_have_short_errors_too(capsys) -> None:
    err = _error(["config", "default", "--mixed_precison", "fp16"], capsys)
    assert err.splitlines()[0] == "usage: accel config default [-h] [options]"
    assert (
        "accel config default: error: unrecognized arguments: --mixed_precison (did you mean --mixed_precision?)" in err
    )
    err = _error(["env", "--bogus"], capsys)
    assert len(err.splitlines()) == 3 and "accel env: error: unrecognized arguments: --bogus" in err
    err = _error(["no-such-command"], capsys)
    assert err.startswith("usage: accel <command> [<args>]\naccel: error: argument <command>: invalid choice")


def test_the_standalone_launch_module_is_short_as_well() -> None:
    shown = run_cli(["--nnodes", "2", "x.py"], module="accel_launch.commands.launch")
    assert shown.returncode == 2 and len(shown.stderr.splitlines()) < 6
    assert "did you mean --num_machines?" in shown.stderr

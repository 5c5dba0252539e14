"""Command functions called from Python raise the documented exceptions; the CLI keeps one-line
messages and exit codes. Also: every unknown config key named at once, the older prefetch flag, the
DeepSpeed-only flag explained, ``tpu-config --accelerate_version dev`` installing accel."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from launch_helpers import run_cli

from accel_launch.commands import launch, to_fsdp2, tpu
from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.values import ConfigError


def test_launch_command_raises_file_not_found_value_error_and_called_process_error(tmp_path, capsys) -> None:
    parser = launch_command_parser()
    with pytest.raises(FileNotFoundError, match="nope.py"):
        launch.launch_command(parser.parse_args(["--cpu", str(tmp_path / "nope.py")]))
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ValueError, match="--num_processes must be at least 1"):
        launch.launch_command(parser.parse_args(["--cpu", "--num_processes", "0", str(script)]))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        launch.launch_command(parser.parse_args(["--cpu", "--quiet", str(script)]))
    assert failed.value.returncode == 3 and str(script) in failed.value.cmd
    assert launch.run(parser.parse_args(["--cpu", "--quiet", str(script)])) == 3  # the CLI: the run's status
    capsys.readouterr()


def test_launch_cli_keeps_one_line_and_status_2(tmp_path) -> None:
    shown = run_cli(["launch", "--cpu", str(tmp_path / "nope.py")])
    assert shown.returncode == 2
    assert shown.stderr.strip().splitlines() == [
        f"accel launch: error: the training script {str(tmp_path / 'nope.py')!r} was not found"
    ]


def test_to_fsdp2_command_raises_the_documented_exceptions(tmp_path, capsys) -> None:
    # The types are those accelerate 1.15's to_fsdp2_command raises for the same input (issue 37).
    parser = to_fsdp2.to_fsdp2_command_parser()

    def convert(*argv: str) -> int:
        return to_fsdp2.to_fsdp2_command(parser.parse_args(list(argv)))

    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert("--config_file", str(tmp_path / "none.yaml"), "--overwrite")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        convert("--config_file", str(tmp_path), "--overwrite")
    source = tmp_path / "fsdp1.yaml"
    source.write_text(
        yaml.safe_dump({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "NO_SHARD"}})
    )
    with pytest.raises(ValueError, match="no --output_file given: .*--overwrite") as neither:
        convert("--config_file", str(source))
    assert not isinstance(neither.value, OSError)  # was FileExistsError; the documented type is ValueError
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert("--config_file", str(source), "--output_file", str(source))
    with pytest.raises(ValueError, match="NO_SHARD"):
        convert("--config_file", str(source), "--overwrite")
    broken = tmp_path / "broken.yaml"
    broken.write_text("fsdp_config: [1, 2\n")
    with pytest.raises(yaml.YAMLError, match="not valid YAML") as invalid:
        convert("--config_file", str(broken), "--overwrite")
    assert isinstance(invalid.value, ConfigError)  # and still accel's ValueError
    for argv in (["--config_file", str(source)], ["--config_file", str(tmp_path), "--overwrite"]):
        assert to_fsdp2.run(parser.parse_args(argv)) == 2
        assert capsys.readouterr().err.startswith("accel to-fsdp2: error:")


def test_tpu_command_raises_and_dev_installs_accel(capsys) -> None:
    parser = tpu.tpu_command_parser()
    with pytest.raises(ValueError, match="no TPU name"):
        tpu.tpu_command_launcher(parser.parse_args(["--tpu_zone", "z", "--command", "x"]))
    assert tpu.run(parser.parse_args(["--tpu_zone", "z", "--command", "x"])) == 2
    capsys.readouterr()
    args = parser.parse_args(
        ["--tpu_name", "t", "--tpu_zone", "z", "--install_accelerate", "--accelerate_version", "dev", "--debug"]
    )
    assert tpu.tpu_command_launcher(args) == 0
    out = capsys.readouterr().out
    assert "pip install -U --pre accel" in out and "huggingface" not in out


def test_unknown_config_keys_are_all_named_top_level_and_sections() -> None:
    with pytest.raises(ConfigError) as error:
        config_from_dict(
            {"num_proceses": 2, "mixed_precison": "no", "fsdp_config": {"fsdp_verson": 2, "fsdp_bogus": 1}},
            source="c.yaml",
        )
    text = str(error.value)
    for key in ("num_proceses", "mixed_precison", "fsdp_verson", "fsdp_bogus"):
        assert repr(key) in text, key
    assert "did you mean 'num_processes'?" in text and "did you mean 'fsdp_version'?" in text


def test_unknown_config_keys_through_accel_launch(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("num_proceses: 2\nuse_cpus: true\n")
    shown = run_cli(["launch", "--config_file", str(config), str(tmp_path / "t.py")])
    assert shown.returncode == 2
    assert "'num_proceses'" in shown.stderr and "'use_cpus'" in shown.stderr


def test_fsdp_backward_prefetch_policy_flag_is_accepted() -> None:
    for flag in ("--fsdp_backward_prefetch_policy", "--fsdp-backward-prefetch-policy"):
        args = launch_command_parser().parse_args(["--use_fsdp", flag, "BACKWARD_POST", "t.py"])
        assert given_flags(args)["fsdp_backward_prefetch"] == "BACKWARD_POST"


def test_gradient_accumulation_steps_without_deepspeed_says_what_it_does(tmp_path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    shown = run_cli(["launch", "--cpu", "--gradient_accumulation_steps", "4", str(script)])
    assert shown.returncode == 0 and "ran" in shown.stdout
    assert "--gradient_accumulation_steps is a DeepSpeed setting" in shown.stderr
    assert "Accelerator(gradient_accumulation_steps=...)" in shown.stderr
    quiet = run_cli(
        ["launch", "--cpu", "--use_deepspeed", "--gradient_accumulation_steps", "4", "--dry_run", str(script)]
    )
    assert "DeepSpeed setting" not in quiet.stderr


def test_a_python_caller_gets_the_exit_status_of_a_simple_run(tmp_path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    code = f"from accel_launch.commands.launch import launch_command, launch_command_parser as p; print(launch_command(p().parse_args(['--cpu', {str(script)!r}])))"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0 and shown.stdout.split() == ["fine", "0"], shown.stderr

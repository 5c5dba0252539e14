"""What the CLI reports about itself: accel env and accel --version name every installed accel
distribution; config default on an existing file names the real option; the documented
``commands.config`` names import."""

from __future__ import annotations

import importlib.metadata

import pytest
from launch_helpers import run_cli

from accel_launch.commands.env import DISTRIBUTIONS, installed_versions


def test_env_lists_every_accel_distribution_including_the_launcher() -> None:
    shown = run_cli(["env"])
    assert shown.returncode == 0, shown.stderr
    assert "- accel-launch version: " + importlib.metadata.version("accel-launch") in shown.stdout
    for name in DISTRIBUTIONS[1:]:
        assert f"- {name} version: " in shown.stdout, name


def test_env_gives_the_meta_package_version_once_in_the_first_line() -> None:
    shown = run_cli(["env"])
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("- ")]
    assert lines[0].startswith("- `accel` version: ")  # the documented first line
    assert not any(line.startswith("- accel version:") for line in lines)  # not a second time below
    assert len([line for line in lines if " version: " in line and "accel" in line.split(" version")[0]]) == 8


def test_env_without_the_meta_package_says_whose_version_heads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_launch.commands import env

    real = env._version
    monkeypatch.setattr(env, "_version", lambda name: "not installed" if name == "accel" else real(name))
    info = env.environment_info()
    headline = info["`accel` version"]
    assert headline.startswith(real("accel-launch")) and "meta-package is not installed" in headline
    assert "accel version" not in info


def test_version_names_the_installed_distributions_not_only_the_launcher() -> None:
    shown = run_cli(["--version"])
    assert shown.returncode == 0
    versions = installed_versions()
    assert len(versions) >= 2 and "accel-launch" in versions and "accel-state" in versions
    for name, value in versions.items():
        assert f"{name} {value}" in shown.stdout
    assert shown.stdout.strip().split(", ")[0].startswith("accel")


def test_config_default_on_an_existing_file_points_at_config_file(tmp_path) -> None:
    path = tmp_path / "cfg.yaml"
    assert run_cli(["config", "default", "--config_file", str(path)]).returncode == 0
    again = run_cli(["config", "default", "--config_file", str(path)])
    assert again.returncode == 1
    assert "--config_file" in again.stderr and "pass a different `save_location`" not in again.stderr


def test_commands_config_offers_the_documented_names(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    from accel_launch.commands import config

    assert config.default_config_file == str(tmp_path / "accelerate" / "default_config.yaml")
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "default_config.yaml").write_text("num_processes: 3\nuse_cpu: true\n")
    loaded = config.load_config_from_file(None)
    assert loaded.num_processes == 3
    assert callable(config.get_config_parser) and callable(config.config_command)


def test_command_modules_offer_the_documented_functions(tmp_path, capsys) -> None:
    import argparse

    from accel_launch.commands import env, launch, to_fsdp2, tpu

    parser = launch.launch_command_parser()
    args = parser.parse_args(["--cpu", "--num_processes", "1", str(tmp_path / "missing.py")])
    with pytest.raises(FileNotFoundError, match="missing.py"):  # from Python: the documented exception
        launch.launch_command(args)
    assert launch.run(args) == 2  # the CLI: a clear line, exit status 2
    assert "missing.py" in capsys.readouterr().err
    subparsers = argparse.ArgumentParser("accel").add_subparsers()
    for make in (tpu.tpu_command_parser, to_fsdp2.to_fsdp2_command_parser, env.env_command_parser):
        assert isinstance(make(), argparse.ArgumentParser) and isinstance(make(subparsers), argparse.ArgumentParser)
    assert env.env_command(env.env_command_parser().parse_args([])) == 0
    assert "PyTorch version" in capsys.readouterr().out
    converted = to_fsdp2.convert_config_to_fsdp2(
        {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}}
    )
    assert converted["fsdp_config"]["fsdp_version"] == 2
    tpu_args = tpu.tpu_command_parser().parse_args(
        ["--tpu_name", "t", "--tpu_zone", "z", "--command", "echo hi", "--debug"]
    )
    assert tpu.tpu_command_launcher(tpu_args) == 0 and "gcloud" in capsys.readouterr().out

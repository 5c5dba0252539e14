"""The ``accel`` command in subprocesses: help without torch, sub-command discovery, clear errors."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from launch_helpers import run_cli

from accel_launch.cli import OWN_COMMANDS, discover

PACKAGE = Path(__file__).resolve().parents[1]
TORCH_CHECK = "import sys, runpy\nsys.argv = ['accel', *{argv!r}]\ntry:\n    runpy.run_module('accel_launch.cli', run_name='__main__')\nexcept SystemExit:\n    pass\nprint('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH', file=sys.stderr)\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["launch", "--help"],
        ["config", "--help"],
        ["env", "--help"],
        ["tpu-config", "--help"],
        ["to-fsdp2", "--help"],
        ["verify", "--help"],
        ["config", "default", "--help"],
    ],
)
def test_help_does_not_import_torch(argv: list[str]) -> None:
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", TORCH_CHECK.format(argv=argv)], capture_output=True, text=True, timeout=60
    )
    assert "usage:" in result.stdout
    assert result.stderr.strip().endswith("NO_TORCH"), result.stderr


def test_top_level_help_lists_commands() -> None:
    result = run_cli(["--help"])
    assert result.returncode == 0
    for name in OWN_COMMANDS:
        assert name in result.stdout


def test_no_command_prints_help_and_fails() -> None:
    result = run_cli([])
    assert result.returncode == 1 and "usage: accel" in result.stdout


def test_launch_help_lists_documented_groups_and_flags() -> None:
    out = run_cli(["launch", "--help"]).stdout
    for text in [
        "Hardware Selection Arguments",
        "Resource Selection Arguments",
        "Training Paradigm Arguments",
        "Distributed GPU Arguments",
        "TPU Arguments",
        "DeepSpeed Arguments",
        "Fully Sharded Data Parallelism Arguments",
        "Megatron-LM Arguments",
        "FP8 Arguments",
        "AWS SageMaker Arguments",
        "--num_cpu_threads_per_process",
        "--enable_cpu_affinity",
        "--rdzv_conf",
        "--monitor_interval",
        "--max_restarts",
        "--gpu_ids",
        "--log_dir",
        "--tee",
        "--no_python",
        "--quiet",
        "--module",
        "--num-processes",
    ]:
        assert text in out, text


def test_pyproject_registers_own_commands() -> None:
    meta = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert meta["scripts"]["accel"] == "accel_launch.cli:main"
    assert meta["entry-points"]["accel.commands"] == OWN_COMMANDS
    assert set(OWN_COMMANDS) <= set(discover())


def test_other_packages_plug_in_through_entry_points(tmp_path: Path) -> None:
    # A fake distribution registering `hello` in the accel.commands group, found through its metadata.
    (tmp_path / "hello_cmd.py").write_text(
        textwrap.dedent("""
        def run(args):
            print(f"hello {args.name}")
            return 3

        def add_parser(subparsers):
            parser = subparsers.add_parser("hello", help="Say hello.")
            parser.add_argument("name")
            parser.set_defaults(func=run)
    """)
    )
    info = tmp_path / "hello_cmd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cmd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[accel.commands]\nhello = hello_cmd:add_parser\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    assert "Say hello." in run_cli(["--help"], env=env).stdout
    result = run_cli(["hello", "world"], env=env)
    assert result.returncode == 3 and result.stdout.strip() == "hello world"


@pytest.mark.parametrize("module", ["launch", "config", "env", "tpu", "to_fsdp2"])
def test_each_command_runs_as_module(module: str) -> None:
    result = run_cli(["--help"], module=f"accel_launch.commands.{module}")
    assert result.returncode == 0 and "usage:" in result.stdout


def test_launch_errors_are_clear(tmp_path: Path, config_home: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    env = {"HF_HOME": str(config_home)}
    cases = {
        ("--cpu", "--num_processes", "0", str(script)): "--num_processes must be at least 1, got 0",
        ("--cpu", str(tmp_path / "missing.py")): "missing.py' was not found",
        ("--use_fsdp", "--use_deepspeed", "--cpu", str(script)): "cannot be combined",
    }
    for argv, message in cases.items():
        result = run_cli(["launch", *argv], env=env)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert "ran" not in result.stdout


def test_unknown_config_key_in_launch(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\nnum_proceses: 2\n")
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    result = run_cli(["launch", "--config_file", str(config), str(script)])
    assert result.returncode == 2
    assert "'num_proceses'" in result.stderr and "did you mean 'num_processes'" in result.stderr


def test_port_in_use_fails_fast(tmp_path: Path, config_home: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # a hang would hit the timeout; the error must come before any process starts
        result = run_cli(
            ["launch", "--cpu", "--num_processes", "2", "--main_process_port", str(port), str(script)],
            env={"HF_HOME": str(config_home)},
            timeout=60,
        )
    assert result.returncode == 2
    assert f"--main_process_port {port} is already in use" in result.stderr
    assert "ran" not in result.stdout


def test_single_process_launch_with_defaults(tmp_path: Path, config_home: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys\nprint(os.environ['ACCELERATE_USE_CPU'], os.environ['ACCELERATE_MIXED_PRECISION'], sys.argv[1:])\n"
    )
    result = run_cli(["launch", str(script), "--x", "1"], env={"HF_HOME": str(config_home)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "true no ['--x', '1']"
    assert result.stderr.count("no config file and no launch flags") == 1


def test_launch_reads_default_config(tmp_path: Path, config_home: Path) -> None:
    (config_home / "accelerate").mkdir(parents=True)
    (config_home / "accelerate" / "default_config.yaml").write_text(
        "mixed_precision: bf16\nuse_cpu: true\ndebug: true\n"
    )
    script = tmp_path / "show.py"
    script.write_text(
        "import os\nprint(os.environ['ACCELERATE_MIXED_PRECISION'], os.environ['ACCELERATE_DEBUG_MODE'])\n"
    )
    result = run_cli(["launch", str(script)], env={"HF_HOME": str(config_home)})
    assert result.stdout.strip() == "bf16 true" and "no config file" not in result.stderr
    flagged = run_cli(["launch", "--mixed_precision", "fp16", str(script)], env={"HF_HOME": str(config_home)})
    assert flagged.stdout.strip() == "fp16 true"


def test_failing_script_exit_code(tmp_path: Path, config_home: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit(7)\n")
    result = run_cli(["launch", "--cpu", str(script)], env={"HF_HOME": str(config_home)})
    assert result.returncode == 7 and "exited with code 7" in result.stderr
    quiet = run_cli(["launch", "--cpu", "-q", str(script)], env={"HF_HOME": str(config_home)})
    assert quiet.returncode == 7 and "exited with code" not in quiet.stderr


def test_config_default_update_and_env(tmp_path: Path, config_home: Path) -> None:
    env = {"HF_HOME": str(config_home)}
    result = run_cli(["config", "default", "--mixed_precision", "bf16"], env=env)
    path = config_home / "accelerate" / "default_config.yaml"
    assert result.returncode == 0 and path.is_file()
    import yaml

    written = yaml.safe_load(path.read_text())
    assert written["mixed_precision"] == "bf16" and written["use_cpu"] is True and written["distributed_type"] == "NO"
    again = run_cli(["config", "default"], env=env)
    assert again.returncode == 1 and "will not override" in again.stderr
    # update keeps the settings and rewrites old spellings
    old = tmp_path / "old.yaml"
    old.write_text("distributed_type: MULTI_GPU\nfp16: true\ndynamo_backend: 'NO'\nnum_processes: 2\n")
    assert run_cli(["config", "update", "--config_file", str(old)]).returncode == 0
    updated = yaml.safe_load(old.read_text())
    assert (
        updated["mixed_precision"] == "fp16"
        and updated["dynamo_config"] == {"dynamo_backend": "NO"}
        and updated["num_processes"] == 2
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_procs: 2\n")
    failed = run_cli(["config", "update", "--config_file", str(bad)])
    assert failed.returncode == 2 and "num_procs" in failed.stderr and bad.read_text() == "num_procs: 2\n"
    shown = run_cli(["env"], env=env)
    assert shown.returncode == 0
    for text in [
        "Platform",
        "Python version",
        "PyTorch version",
        "System RAM",
        "CPU cores",
        "mixed_precision: bf16",
        str(path),
    ]:
        assert text in shown.stdout, text


def test_tpu_config_debug_prints_gcloud(tmp_path: Path) -> None:
    commands = tmp_path / "cmds.txt"
    commands.write_text("echo one\n# comment\necho two\n")
    result = run_cli(
        [
            "tpu-config",
            "--tpu_name",
            "pod",
            "--tpu_zone",
            "us-central1-a",
            "--command_file",
            str(commands),
            "--install_accelerate",
            "--debug",
        ]
    )
    assert result.returncode == 0
    line = result.stdout.strip()
    assert line.startswith("Running gcloud compute tpus tpu-vm ssh pod --zone us-central1-a --command")
    assert "cd /usr/share; pip install -U accel; echo one; echo two" in line and line.endswith("--worker all")
    missing = run_cli(["tpu-config", "--command", "ls", "--debug", "--config_file", str(tmp_path / "none.yaml")])
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    no_name = run_cli(["tpu-config", "--command", "ls", "--debug"], env={"HF_HOME": str(tmp_path / "empty")})
    assert no_name.returncode == 2 and "TPU name" in no_name.stderr


def test_to_fsdp2_converts(tmp_path: Path) -> None:
    import yaml

    source = tmp_path / "fsdp1.yaml"
    source.write_text(
        "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
        "  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_use_orig_params: true\n  fsdp_sync_module_states: true\n"
        "  fsdp_offload_params: false\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
    )
    target = tmp_path / "fsdp2.yaml"
    result = run_cli(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)])
    assert result.returncode == 0, result.stderr
    fsdp = yaml.safe_load(target.read_text())["fsdp_config"]
    assert fsdp == {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": False,
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    refused = run_cli(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)])
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    no_shard = tmp_path / "ns.yaml"
    no_shard.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n")
    failed = run_cli(["to-fsdp2", "--config_file", str(no_shard), "--output_file", str(tmp_path / "o.json")])
    assert failed.returncode == 2 and "NO_SHARD" in failed.stderr
    plain = tmp_path / "plain.yaml"
    plain.write_text(json.dumps({"distributed_type": "MULTI_GPU"}))
    assert run_cli(["to-fsdp2", "--config_file", str(plain), "--output_file", str(tmp_path / "p.yaml")]).returncode == 2

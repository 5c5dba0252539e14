"""``accel test`` and ``accel merge-weights`` (argument parsing, the self-test, merging shards)."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from accel_train.commands import merge as merge_command
from accel_train.commands import test as test_command


def _subparsers() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser("accel")
    return parser, parser.add_subparsers()


def test_command_modules_do_not_import_torch_at_module_level() -> None:
    import subprocess
    import sys

    code = "import sys, accel_train.commands.test, accel_train.commands.merge; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_parsers_register_and_parse() -> None:
    parser, subparsers = _subparsers()
    test_command.add_parser(subparsers)
    merge_command.add_parser(subparsers)
    args = parser.parse_args(["test", "--config_file", "x.yaml"])
    assert args.config_file == "x.yaml" and args.func is test_command.run
    args = parser.parse_args(["merge-weights", "in", "out", "--unsafe_serialization"])
    assert args.checkpoint_directory == "in" and args.unsafe_serialization and args.func is merge_command.run


def test_accel_test_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert test_command.main(["--config_file", "/nonexistent.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def _self_test(end_training: bool = True) -> int:
    from accel_state.testing import reset_shared_state
    from accel_train.test_utils import test_script

    reset_shared_state()
    test_script.RESULTS.clear()
    return test_script.main(end_training=end_training)


def test_self_test_passes_on_two_processes(dist_pool) -> None:
    assert dist_pool.run(_self_test, False) == [0, 0]


def test_self_test_passes_in_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert _self_test() == 0
    out = capsys.readouterr().out
    assert "7/7 checks passed on 1 process(es)" in out and "PASS  save_state / load_state round trip" in out


def test_merge_weights_of_a_distributed_checkpoint(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.randn(3, 4), "b": torch.arange(3.0)}}
    dcp.save(state, checkpoint_id=str(tmp_path / "pytorch_model_fsdp_0"), no_dist=True)
    assert merge_command.main([str(tmp_path), str(tmp_path / "out")]) == 0
    from safetensors.torch import load_file

    merged = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(merged["w"], state["model"]["w"]) and torch.equal(merged["b"], state["model"]["b"])
    assert (
        merge_command.main(
            [
                str(tmp_path / "pytorch_model_fsdp_0"),
                str(tmp_path / "bin"),
                "--unsafe_serialization",
                "--remove_checkpoint_dir",
            ]
        )
        == 0
    )
    assert torch.equal(torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)["w"], state["model"]["w"])
    assert not os.path.exists(tmp_path / "pytorch_model_fsdp_0")


def test_merge_weights_rejects_other_folders(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert merge_command.main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a torch.distributed.checkpoint folder" in capsys.readouterr().err
    assert merge_command.main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 2

"""Module-level functions of the documented system: accel.checkpointing's save/load functions and the
command modules' parser/command pairs."""

from __future__ import annotations

import argparse
import os

import torch

from accel_train.checkpointing import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_save_and_load_accelerator_state_round_trip(tmp_path) -> None:
    model, optimizer, scheduler = _trained()
    out = save_accelerator_state(tmp_path / "ckpt", [model.state_dict()], [optimizer], [scheduler], [], 0)
    assert sorted(os.listdir(out)) == [
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.safetensors",
        "scheduler.bin",
    ]
    expected_random = torch.rand(3)
    fresh_model = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.5)
    assert load_accelerator_state(out, [fresh_model], [fresh_optimizer], [fresh_scheduler], [], 0) == {}
    assert torch.equal(fresh_model.weight, model.weight)
    assert fresh_scheduler.last_epoch == 1 and fresh_optimizer.param_groups[0]["lr"] == 0.05
    assert torch.equal(
        fresh_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
    assert torch.equal(torch.rand(3), expected_random)  # the random state saved before the draw is back


def test_save_and_load_custom_state(tmp_path) -> None:
    counter = Counter()
    counter.count = 7
    save_custom_state(counter, tmp_path, index=2)
    assert os.path.isfile(tmp_path / "custom_checkpoint_2.pkl")
    other = Counter()
    load_custom_state(other, tmp_path, index=2)
    assert other.count == 7


def test_train_command_functions(tmp_path, capsys) -> None:
    from accel_train.commands import merge
    from accel_train.commands import test as selftest

    sub = argparse.ArgumentParser("accel").add_subparsers()
    assert isinstance(merge.merge_command_parser(sub), argparse.ArgumentParser)
    args = merge.merge_command_parser().parse_args([str(tmp_path / "nope"), str(tmp_path / "out")])
    assert merge.merge_command(args) != 0
    parsed = selftest.test_command_parser().parse_args(["--config_file", str(tmp_path / "missing.yaml")])
    assert selftest.test_command(parsed) == 2 and "does not exist" in capsys.readouterr().err

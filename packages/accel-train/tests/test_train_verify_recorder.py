"""The `accel verify` recorder inside the Accelerator: off (and not imported) without its variable; with
it, per-step loss, gradient norm and learning rate, the final weights, and a clean end of the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from accel_train import Accelerator
from accel_train.verify_recorder import RECORD_VAR, STEPS_VAR, recorder_from_environment


def _train(accelerator: Accelerator, micro_steps: int, accumulate: int = 1) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(1)
    for _ in range(micro_steps):
        with accelerator.accumulate(model):
            x = torch.randn(4, 3, generator=generator)
            accelerator.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()


def test_without_the_variable_nothing_is_recorded_and_the_module_is_not_imported() -> None:
    code = (
        "import sys, torch\n"
        "from accel_train import Accelerator\n"
        "a = Accelerator(cpu=True)\n"
        "m, o = a.prepare(torch.nn.Linear(2, 1), torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))\n"
        "a.backward(m(torch.ones(1, 2)).sum()); o.step()\n"
        "print(a._verify, o._verify_hook, 'accel_train.verify_recorder' in sys.modules)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != RECORD_VAR}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["None", "None", "False"]


def test_no_record_path_means_no_recorder() -> None:
    assert recorder_from_environment(object(), {}) is None
    assert recorder_from_environment(object(), {RECORD_VAR: ""}) is None


@pytest.mark.parametrize("raw", ["0", "-1", "five"])
def test_a_bad_step_count_is_named(raw: str) -> None:
    with pytest.raises(ValueError, match=rf"{STEPS_VAR}='{raw}'.*whole number >= 1"):
        recorder_from_environment(object(), {RECORD_VAR: "/tmp/x.json", STEPS_VAR: raw})


def test_records_each_optimizer_step_then_ends_the_run(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "2")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    with pytest.raises(SystemExit) as ended:
        _train(accelerator, micro_steps=10)
    assert ended.value.code == 0
    record = json.loads(path.read_text())
    assert record["complete"] is True and record["backward_calls"] == 4
    assert [step["step"] for step in record["steps"]] == [1, 2]
    assert all(step["lr"] == pytest.approx(0.1) and step["grad_norm"] > 0 for step in record["steps"])
    weights = torch.load(str(path) + ".params.pt", weights_only=True)
    assert sorted(weights) == ["bias", "weight"]


def test_the_recorded_loss_is_the_mean_of_the_micro_steps_and_the_norm_the_gradients(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "1")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = [torch.tensor(2.0, requires_grad=True) * model.weight.sum(), model.bias.sum() * 0 + 4.0]
    expected_grad = torch.cat([torch.full((3,), 2.0 / 2), torch.zeros(1)]).norm()
    with pytest.raises(SystemExit):
        for loss in losses:
            with accelerator.accumulate(model):
                accelerator.backward(loss)
                optimizer.step()
    step = json.loads(path.read_text())["steps"][0]
    assert step["loss"] == pytest.approx((float(losses[0].detach()) + 4.0) / 2)
    assert step["grad_norm"] == pytest.approx(float(expected_grad))
    assert step["lr"] == pytest.approx(0.5)


def test_a_run_that_stops_early_leaves_an_incomplete_record(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "5")
    _train(Accelerator(cpu=True), micro_steps=3)
    record = json.loads(path.read_text())
    assert record["complete"] is False and len(record["steps"]) == 3 and record["params_file"] is None


def test_the_learning_rate_is_the_one_each_step_used(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "3")
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    with pytest.raises(SystemExit):
        for _ in range(5):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert [step["lr"] for step in json.loads(path.read_text())["steps"]] == pytest.approx([0.4, 0.2, 0.1])

"""The `accel verify` recorder inside the Accelerator: off (and not imported) without its variable; with
it, per-step loss, gradient norm and learning rate, the final weights, and a clean end of the run."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from accel_train import Accelerator
from accel_train.verify_recorder import (
    RECORD_VAR,
    RESUME_DIR_VAR,
    RESUME_VAR,
    SAVE_AT_VAR,
    STEPS_VAR,
    recorder_from_environment,
)


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
    assert record["num_processes"] == 1 and record["data_parallel_size"] == 1
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


def test_an_optimizer_never_prepared_is_followed_and_named_then_let_go(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "2")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)  # the mistake: never passed to prepare
    model = accelerator.prepare(model)
    generator = torch.Generator().manual_seed(1)
    with pytest.raises(SystemExit) as ended:
        for _ in range(5):
            accelerator.backward(model(torch.randn(4, 3, generator=generator)).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    assert ended.value.code == 0
    record = json.loads(path.read_text())
    assert record["complete"] is True and record["optimizer_prepared"] is False
    assert [step["step"] for step in record["steps"]] == [1, 2]
    assert all(step["lr"] == pytest.approx(0.3) and step["grad_norm"] > 0 for step in record["steps"])
    # the run is over: another optimizer's steps in this process are not followed any more
    written = path.read_text()
    other = torch.nn.Linear(2, 1)
    later = torch.optim.SGD(other.parameters(), lr=0.1)
    other(torch.ones(1, 2)).sum().backward()
    later.step()
    assert path.read_text() == written


def test_a_prepared_optimizer_is_recorded_as_prepared(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, "1")
    with pytest.raises(SystemExit):
        _train(Accelerator(cpu=True), micro_steps=3)
    assert json.loads(path.read_text())["optimizer_prepared"] is True


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


# -- accel verify --resume-at: the saving run, the resumed run ---------------------------------------------


def _resumable_run(
    accelerator: Accelerator, *, resume: str | None = None, skip: int = 0, zero_grad_first: bool = False
) -> None:
    """Dropout, a shuffled loader and a scheduler: a resume that loses the random state, the data order or
    the scheduler shows in the steps after it. ``resume`` set: the script resumes by itself from there
    (``load_state``, then ``skip`` batches)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(32, 3, generator=generator), torch.randn(32, 1, generator=generator)
    )
    # a generator of its own: the order of a resumed epoch does not hang on torch's global generator
    shuffle = torch.Generator().manual_seed(2)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=shuffle)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    if resume is not None:
        accelerator.load_state(resume)
        loader = accelerator.skip_first_batches(loader, skip)
    for x, y in loader:
        with accelerator.accumulate(model):
            if zero_grad_first:
                optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            if not zero_grad_first:
                optimizer.zero_grad()


def _resume_env(monkeypatch, tmp_path, label: str, steps: int, **extra: str) -> pathlib.Path:
    path = tmp_path / f"{label}.json"
    monkeypatch.setenv(RECORD_VAR, str(path))
    monkeypatch.setenv(STEPS_VAR, str(steps))
    monkeypatch.setenv(RESUME_DIR_VAR, str(tmp_path / "resume"))
    for name in (SAVE_AT_VAR, RESUME_VAR):
        monkeypatch.delenv(name, raising=False)
    for name, value in extra.items():
        monkeypatch.setenv(name, value)
    return path


def _save_then_resume(
    tmp_path, monkeypatch, *, accumulate: int = 1, zero_grad_first: bool = False, loader: str = "default", **resumed
):
    from accel_data import DataLoaderConfiguration
    from accel_state.testing import reset_shared_state

    def accelerator() -> Accelerator:
        config = DataLoaderConfiguration(
            use_stateful_dataloader=loader == "stateful", replay_epoch_on_resume=loader == "replay"
        )
        return Accelerator(cpu=True, gradient_accumulation_steps=accumulate, dataloader_config=config)

    saving = _resume_env(monkeypatch, tmp_path, "saving", 4, ACCEL_VERIFY_SAVE_AT="2")
    with pytest.raises(SystemExit):
        _resumable_run(accelerator(), zero_grad_first=zero_grad_first)
    reset_shared_state()
    mode = "script" if "resume" in resumed else "recorder"
    resumed_path = _resume_env(monkeypatch, tmp_path, "resumed", 4, ACCEL_VERIFY_RESUME=mode)
    with pytest.raises(SystemExit):
        _resumable_run(accelerator(), zero_grad_first=zero_grad_first, **resumed)
    return json.loads(saving.read_text()), json.loads(resumed_path.read_text()), saving, resumed_path


def _same_steps(first: list[dict], second: list[dict]) -> bool:
    return [step["step"] for step in first] == [step["step"] for step in second] and all(
        a[key] == pytest.approx(b[key], rel=1e-6) for a, b in zip(first, second) for key in ("loss", "grad_norm", "lr")
    )


@pytest.mark.parametrize(
    ("accumulate", "zero_grad_first", "loader"),
    [(1, False, "default"), (2, False, "default"), (1, True, "default"), (1, False, "stateful"), (1, False, "replay")],
)
def test_the_recorder_resumes_a_script_that_does_not_resume_by_itself(
    tmp_path, monkeypatch, accumulate: int, zero_grad_first: bool, loader: str
) -> None:
    # stateful: load_state puts the loader back by itself; replay: load_state would rewind it to its epoch's
    # start, which an unchanged script does not skip (the recorder keeps the saved position)
    saving, resumed, saving_path, resumed_path = _save_then_resume(
        tmp_path, monkeypatch, accumulate=accumulate, zero_grad_first=zero_grad_first, loader=loader
    )
    point = json.loads((tmp_path / "resume" / "resume.json").read_text())
    assert point["step"] == 2 and os.path.isdir(point["checkpoint"])
    assert [step["step"] for step in saving["steps"]] == [1, 2, 3, 4] and saving["save_at"] == 2
    assert resumed["first_step"] == 3 and resumed["resumed_by"] == "recorder" and resumed["complete"] is True
    assert _same_steps(resumed["steps"], saving["steps"][2:])
    uninterrupted = torch.load(str(saving_path) + ".params.pt", weights_only=True)
    after_resume = torch.load(str(resumed_path) + ".params.pt", weights_only=True)
    assert all(torch.allclose(uninterrupted[name], after_resume[name], rtol=1e-6) for name in uninterrupted)


def test_a_script_that_resumes_by_itself_is_followed(tmp_path, monkeypatch) -> None:
    checkpoint = str(tmp_path / "resume" / "state")
    saving, resumed, _, _ = _save_then_resume(tmp_path, monkeypatch, resume=checkpoint, skip=2)
    assert resumed["resumed_by"] == "script" and _same_steps(resumed["steps"], saving["steps"][2:])


def test_a_script_that_skips_the_seen_batches_twice_differs_at_the_first_step_after_the_resume(
    tmp_path, monkeypatch
) -> None:
    checkpoint = str(tmp_path / "resume" / "state")
    saving, resumed, _, _ = _save_then_resume(tmp_path, monkeypatch, resume=checkpoint, skip=4)
    assert resumed["steps"][0]["step"] == 3
    assert resumed["steps"][0]["lr"] == pytest.approx(saving["steps"][2]["lr"])  # the scheduler came back
    assert resumed["steps"][0]["loss"] != pytest.approx(saving["steps"][2]["loss"], rel=1e-6)  # not the batch


def test_a_script_resumed_by_its_arguments_that_never_loads_is_named(tmp_path, monkeypatch) -> None:
    from accel_state.testing import reset_shared_state

    _resume_env(monkeypatch, tmp_path, "saving", 3, ACCEL_VERIFY_SAVE_AT="1")
    with pytest.raises(SystemExit):
        _resumable_run(Accelerator(cpu=True))
    reset_shared_state()
    _resume_env(monkeypatch, tmp_path, "resumed", 3, ACCEL_VERIFY_RESUME="script")
    with pytest.raises(RuntimeError, match=r"without calling accelerator.load_state: .*--resume-args"):
        _resumable_run(Accelerator(cpu=True))


def test_a_resumed_run_that_never_prepares_what_was_saved_is_named(tmp_path, monkeypatch) -> None:
    from accel_state.testing import reset_shared_state

    _resume_env(monkeypatch, tmp_path, "saving", 3, ACCEL_VERIFY_SAVE_AT="1")
    with pytest.raises(SystemExit):
        _resumable_run(Accelerator(cpu=True))
    reset_shared_state()
    _resume_env(monkeypatch, tmp_path, "resumed", 3, ACCEL_VERIFY_RESUME="recorder")
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    with pytest.raises(RuntimeError, match=r"optimizers: 0 here, 1 when saved.*--resume-args"):
        accelerator.backward(model(torch.ones(2, 3)).sum())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({SAVE_AT_VAR: "3", RESUME_DIR_VAR: "/tmp/r"}, r"ACCEL_VERIFY_SAVE_AT='3'.*from 1 to 2"),
        ({SAVE_AT_VAR: "0", RESUME_DIR_VAR: "/tmp/r"}, r"ACCEL_VERIFY_SAVE_AT='0'.*from 1 to 2"),
        ({SAVE_AT_VAR: "1"}, r"ACCEL_VERIFY_SAVE_AT is set but ACCEL_VERIFY_RESUME_DIR is not"),
        (
            {RESUME_VAR: "later", RESUME_DIR_VAR: "/tmp/r"},
            r"ACCEL_VERIFY_RESUME='later': expected one of recorder, script",
        ),
    ],
)
def test_bad_resume_variables_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        recorder_from_environment(object(), {RECORD_VAR: "/tmp/x.json", STEPS_VAR: "3", **env})


def test_a_resume_point_that_is_missing_is_named(tmp_path) -> None:
    from accel_train.verify_resume import ResumePoint

    with pytest.raises(FileNotFoundError, match=r"resume.json is missing.*did not reach its save"):
        ResumePoint.read(str(tmp_path))
    (tmp_path / "resume.json").write_text('{"step": "two"}')
    with pytest.raises(ValueError, match=r"is not a resume point"):
        ResumePoint.read(str(tmp_path))


def test_the_resume_point_is_saved_in_verify_s_folder_even_with_automatic_checkpoint_naming(
    tmp_path, monkeypatch
) -> None:
    from accel_train import ProjectConfiguration

    _resume_env(monkeypatch, tmp_path, "saving", 3, ACCEL_VERIFY_SAVE_AT="1")
    project = ProjectConfiguration(project_dir=str(tmp_path / "project"), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    with pytest.raises(SystemExit):
        _resumable_run(accelerator)
    point = json.loads((tmp_path / "resume" / "resume.json").read_text())
    assert point["checkpoint"] == str(tmp_path / "resume" / "state") and os.path.isdir(point["checkpoint"])
    assert not (tmp_path / "project" / "checkpoints").exists() and project.automatic_checkpoint_naming is True

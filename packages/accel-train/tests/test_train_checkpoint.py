"""save_state / load_state: layout, automatic naming, atomicity, refusal to unpickle, exact resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from train_helpers import TinyNet, flat_params, regression_dataset

from accel_state.testing import reset_shared_state
from accel_train import Accelerator, CheckpointMismatchError, ProjectConfiguration, UnsafeCheckpointError


def _prepared(accelerator: Accelerator, seed: int = 0, with_scheduler: bool = True) -> tuple:
    torch.manual_seed(seed)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    objects = [model, optimizer]
    if with_scheduler:
        objects.append(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9))
    return accelerator.prepare(*objects)


def _train_steps(accelerator: Accelerator, model, optimizer, scheduler, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


class Counter:
    """A custom object for register_for_checkpointing."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def test_layout_and_round_trip(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _prepared(accelerator)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    _train_steps(accelerator, model, optimizer, scheduler, 3)
    counter.count = 7
    accelerator.step = 11
    out = accelerator.save_state(tmp_path / "ckpt")
    assert out == str(tmp_path / "ckpt")
    assert sorted(os.listdir(out)) == [
        "accel_checkpoint.json",
        "custom_checkpoint_0.pkl",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.safetensors",
        "scheduler.bin",
    ]
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary folder left behind
    manifest = json.loads((tmp_path / "ckpt" / "accel_checkpoint.json").read_text())
    assert manifest["models"] == ["model.safetensors"] and manifest["num_processes"] == 1

    saved = flat_params(model)
    saved_lr = scheduler.get_last_lr()
    saved_state = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    next_draw = torch.rand(3)
    _train_steps(accelerator, model, optimizer, scheduler, 2)
    counter.count = 0
    accelerator.step = 0
    accelerator.load_state(tmp_path / "ckpt")
    assert torch.equal(flat_params(model), saved)
    assert scheduler.get_last_lr() == saved_lr
    assert all(torch.equal(v, saved_state[k]) for k, v in optimizer.state_dict()["state"][0].items())
    assert counter.count == 7 and accelerator.step == 11
    assert torch.equal(torch.rand(3), next_draw)  # random state restored


def test_unsafe_serialization_writes_pytorch_model_bin(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model, _optimizer = _prepared(accelerator, with_scheduler=False)
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    assert "pytorch_model.bin" in os.listdir(tmp_path / "ckpt")
    expected = flat_params(model)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(tmp_path / "ckpt")
    assert torch.equal(flat_params(model), expected)


def test_tied_weights_saved_once_and_restored(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight
    model = accelerator.prepare(model)
    accelerator.save_state(tmp_path / "ckpt")
    from safetensors.torch import load_file

    assert list(load_file(tmp_path / "ckpt" / "model.safetensors")) == ["0.weight"]
    expected = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.zero_()
    accelerator.load_state(tmp_path / "ckpt")
    assert torch.equal(model[1].weight, expected) and model[1].weight is model[0].weight


def test_existing_automatic_checkpoint_is_not_overwritten(tmp_path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    _prepared(accelerator)
    accelerator.save_state()
    accelerator.project_configuration.iteration = 0
    with pytest.raises(ValueError, match="checkpoint_0 .* already exists"):
        accelerator.save_state()


def test_save_state_needs_a_folder() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="save_state needs an `output_dir`"):
        accelerator.save_state()
    with pytest.raises(ValueError, match="load_state needs an `input_dir`"):
        accelerator.load_state()


def test_overwriting_a_folder_keeps_user_files(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model, _ = _prepared(accelerator, with_scheduler=False)
    accelerator.save_state(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with torch.no_grad():
        model.fc1.weight.add_(1)
    accelerator.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_missing_and_extra_files_are_listed(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    _model, _optimizer, _scheduler = _prepared(accelerator)
    accelerator.save_state(tmp_path / "ckpt")
    os.remove(tmp_path / "ckpt" / "optimizer.bin")
    with pytest.raises(CheckpointMismatchError, match=r"missing: optimizer\.bin \(optimizer 0; 1 prepared\)"):
        accelerator.load_state(tmp_path / "ckpt")

    reset_shared_state()
    two = Accelerator(cpu=True)
    _prepared(two)
    extra_model = two.prepare(torch.nn.Linear(2, 2))
    assert extra_model is not None
    two.save_state(tmp_path / "two")
    reset_shared_state()
    one = Accelerator(cpu=True)
    _prepared(one)
    with pytest.raises(CheckpointMismatchError, match=r"extra: model_1\.safetensors \(the checkpoint holds 2 model"):
        one.load_state(tmp_path / "two")


def test_load_from_missing_folder() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        accelerator.load_state("/nonexistent/ckpt")


class Exploit:
    """Unpickling this runs code: it writes a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_malicious_pickle_is_never_executed(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    _, optimizer, _ = _prepared(accelerator)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    accelerator.save_state(tmp_path / "ckpt")
    marker = tmp_path / "marker"
    torch.save({"state": Exploit(str(marker))}, tmp_path / "ckpt" / "optimizer.bin")
    with pytest.raises(UnsafeCheckpointError, match="optimizer.bin"):
        accelerator.load_state(tmp_path / "ckpt")
    assert not marker.exists()
    # A raw pickle in place of a registered object's file: refused too.
    torch.save(optimizer.state_dict(), tmp_path / "ckpt" / "optimizer.bin")
    import pickle

    with open(tmp_path / "ckpt" / "custom_checkpoint_0.pkl", "wb") as handle:
        pickle.dump(Exploit(str(marker)), handle)
    with pytest.raises(UnsafeCheckpointError):
        accelerator.load_state(tmp_path / "ckpt")
    assert not marker.exists()
    # A pickled random-state file (as other tools write it) is ignored, never unpickled.
    os.remove(tmp_path / "ckpt" / "custom_checkpoint_0.pkl")
    accelerator._custom_objects.clear()
    os.remove(tmp_path / "ckpt" / "random_states_0.safetensors")
    with open(tmp_path / "ckpt" / "random_states_0.pkl", "wb") as handle:
        pickle.dump(Exploit(str(marker)), handle)
    accelerator.load_state(tmp_path / "ckpt")
    assert not marker.exists()


_KILLED_SAVE = textwrap.dedent(
    """
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    from train_helpers import TinyNet
    from accel_train import Accelerator, ProjectConfiguration

    class Bomb:
        def state_dict(self):
            os.kill(os.getpid(), signal.SIGKILL)  # killed while the checkpoint is being written
        def load_state_dict(self, state):
            pass

    config = ProjectConfiguration(project_dir={project!r}, automatic_checkpoint_naming=True, total_limit=1)
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = accelerator.prepare(TinyNet())
    accelerator.save_state()
    print("first saved", flush=True)
    with torch.no_grad():
        model.fc1.weight.add_(1.0)
    accelerator.register_for_checkpointing(Bomb())
    accelerator.save_state()
    print("not reached", flush=True)
    """
)


def test_process_killed_during_save_leaves_previous_checkpoint(tmp_path) -> None:
    script = tmp_path / "killed.py"
    project = tmp_path / "project"
    script.write_text(_KILLED_SAVE.format(tests=os.path.dirname(__file__), project=str(project)))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == -9 and "first saved" in result.stdout and "not reached" not in result.stdout
    entries = sorted(os.listdir(project / "checkpoints"))
    # the killed save's own partial folder, and its lock file (released by the kill, reused by the next save)
    partial = next(e for e in entries if e.startswith(".checkpoint_1.") and e.endswith(".partial"))
    assert entries == sorted([".checkpoint_1.lock", partial, "checkpoint_0"])  # total_limit never removed the good one
    assert "model.safetensors" in os.listdir(project / "checkpoints" / partial)

    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=1, continue_numbering_on_load=True
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    expected = flat_params(TinyNet())
    torch.manual_seed(3)
    model = accelerator.prepare(TinyNet())
    accelerator.load_state()  # picks checkpoint_0, not the partial one
    assert torch.equal(flat_params(model), expected)
    with pytest.raises(CheckpointMismatchError, match="incomplete checkpoint"):
        accelerator.load_state(project / "checkpoints" / partial)
    accelerator.save_state()  # numbering continues (opted in) and the partial folder is replaced
    assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_1"]


def _resume_run(tmp_path, total_steps: int, save_at: int | None, load: bool, dropout: bool = True) -> torch.Tensor:
    """Train TinyNet on a shuffled loader for ``total_steps`` batches over several epochs."""
    reset_shared_state()
    from accel_data import DataLoaderConfiguration
    from accel_state.random import set_seed

    # The loop below does not skip by hand: it opts in to resuming at the saved batch.
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    set_seed(123)
    model = TinyNet()
    if not dropout:
        model.drop.p = 0.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
    loader = torch.utils.data.DataLoader(regression_dataset(40), batch_size=6, shuffle=True)  # 7 batches per epoch
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if load:
        accelerator.load_state(tmp_path / "resume")
    done = 0
    if load:
        done = save_at or 0
    while done < total_steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            done += 1
            if save_at is not None and not load and done == save_at:
                accelerator.save_state(tmp_path / "resume")
                return flat_params(model)
            if done == total_steps:
                break
    return flat_params(model)


@pytest.mark.parametrize("save_at", [7, 10, 12])  # epoch boundary; mid-epoch at a sync step; mid-accumulation
def test_resume_is_exact_single_process(tmp_path, save_at: int) -> None:
    uninterrupted = _resume_run(tmp_path, 17, None, load=False, dropout=False)
    _resume_run(tmp_path, 17, save_at, load=False, dropout=False)
    resumed = _resume_run(tmp_path, 17, save_at, load=True, dropout=False)
    assert torch.equal(resumed, uninterrupted)


@pytest.mark.parametrize("save_at", [7, 10])
def test_resume_is_exact_with_dropout(tmp_path, save_at: int) -> None:
    """The resumed loader does not draw from torch's generator again, so the dropout masks stay in step."""
    uninterrupted = _resume_run(tmp_path, 17, None, load=False)
    _resume_run(tmp_path, 17, save_at, load=False)
    resumed = _resume_run(tmp_path, 17, save_at, load=True)
    assert torch.equal(resumed, uninterrupted)


def test_save_and_load_pre_hooks(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model, _ = _prepared(accelerator, with_scheduler=False)
    seen = {}

    def save_hook(models, weights, output_dir):
        seen["save"] = (len(models), sorted(weights[0]))
        with open(os.path.join(output_dir, "config.json"), "w") as handle:
            json.dump({"width": 8}, handle)

    def load_hook(models, input_dir):
        seen["load"] = (len(models), json.loads(open(os.path.join(input_dir, "config.json")).read()))

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    load_handle = accelerator.register_load_state_pre_hook(load_hook)
    accelerator.save_state(tmp_path / "ckpt")
    accelerator.load_state(tmp_path / "ckpt")
    assert seen["save"] == (1, sorted(model.state_dict()))
    assert seen["load"] == (1, {"width": 8})
    assert (tmp_path / "ckpt" / "config.json").is_file()  # written by the hook into the checkpoint
    save_handle.remove()
    load_handle.remove()
    seen.clear()
    accelerator.save_state(tmp_path / "ckpt2")
    accelerator.load_state(tmp_path / "ckpt2")
    assert seen == {}


def test_save_hook_can_take_over_model_saving(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    model, _ = _prepared(accelerator, with_scheduler=False)

    def save_hook(models, weights, output_dir):
        torch.save(weights.pop(0), os.path.join(output_dir, "custom_weights.pt"))

    def load_hook(models, input_dir):
        model = models.pop(0)
        model.load_state_dict(torch.load(os.path.join(input_dir, "custom_weights.pt"), weights_only=True))

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    accelerator.save_state(tmp_path / "ckpt")
    assert "model.safetensors" not in os.listdir(tmp_path / "ckpt")
    expected = flat_params(model)
    with torch.no_grad():
        model.fc1.weight.zero_()
    accelerator.load_state(tmp_path / "ckpt")
    assert torch.equal(flat_params(model), expected)


def test_register_for_checkpointing_needs_state_dict() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="0: object"):
        accelerator.register_for_checkpointing(object())


def test_fp16_scaler_state_is_saved(tmp_path) -> None:
    from accel_train import GradScalerKwargs

    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=512)])
    model, optimizer = _prepared(accelerator, with_scheduler=False)
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    accelerator.save_state(tmp_path / "ckpt")
    assert "scaler.pt" in os.listdir(tmp_path / "ckpt")
    accelerator.scaler.update(new_scale=8.0)
    accelerator.load_state(tmp_path / "ckpt")
    assert accelerator.scaler.get_scale() == 512
    os.remove(tmp_path / "ckpt" / "scaler.pt")
    with pytest.raises(CheckpointMismatchError, match="scaler.pt"):
        accelerator.load_state(tmp_path / "ckpt")


def test_views_of_one_buffer_are_stored_separately(tmp_path) -> None:
    from accel_train.checkpoint import file_io as io

    flat = torch.arange(10.0)
    state = {"a": flat[:4].view(2, 2), "b": flat[4:], "tied": flat[:4].view(2, 2)}
    io.save_weights(state, str(tmp_path / "w.safetensors"))
    loaded = io.load_weights(str(tmp_path / "w.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    from safetensors.torch import load_file

    assert sorted(load_file(tmp_path / "w.safetensors")) == ["a", "b"]  # the tied view is stored once

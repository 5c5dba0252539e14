"""Automatic checkpoint naming: which ``checkpoint_<n>`` a save writes, before and after ``load_state``.

The figures are those of the documented system (accelerate 1.15, run side by side): only ``save_state``
advances ``ProjectConfiguration.iteration``; ``load_state`` leaves it alone, whatever it loads. accel's
opt-in ``continue_numbering_on_load`` makes a load of ``checkpoint_<n>`` continue at ``n + 1``.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from train_helpers import TinyNet, flat_params

from accel_state.testing import reset_shared_state
from accel_train import Accelerator, CheckpointMismatchError, ProjectConfiguration


def _accelerator(project, seed: int = 0, **config) -> tuple[Accelerator, torch.nn.Module]:
    """A fresh Accelerator with automatic naming in ``project``, and a prepared TinyNet (weights from ``seed``)."""
    reset_shared_state()
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, **config),
    )
    torch.manual_seed(seed)
    model = TinyNet()
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return accelerator, model


def _listing(project) -> list[str]:
    return sorted(os.listdir(os.path.join(project, "checkpoints")))


def _three_saves(project, **config) -> list[torch.Tensor]:
    """checkpoint_0..2 in ``project`` (each from different weights); returns the weights of each."""
    accelerator, model = _accelerator(project, **config)
    saved = []
    for step in range(3):
        with torch.no_grad():
            model.fc1.weight.fill_(float(step))
        saved.append(flat_params(model))
        accelerator.save_state()
    assert accelerator.save_iteration == 3
    return saved


def test_saves_count_up_and_total_limit_keeps_the_newest(tmp_path) -> None:
    accelerator, _ = _accelerator(tmp_path, total_limit=2)
    folders = [accelerator.save_state() for _ in range(3)]
    assert [os.path.basename(f) for f in folders] == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    assert _listing(tmp_path) == ["checkpoint_1", "checkpoint_2"]
    assert accelerator.save_iteration == accelerator.project_configuration.iteration == 3


@pytest.mark.parametrize("which", ["latest", "explicit"])
def test_load_state_in_the_same_project_leaves_the_numbering_alone(tmp_path, which) -> None:
    saved = _three_saves(tmp_path)
    accelerator, model = _accelerator(tmp_path, seed=5, total_limit=3)
    if which == "latest":
        accelerator.load_state()
    else:
        accelerator.load_state(tmp_path / "checkpoints" / "checkpoint_2")
    assert torch.equal(flat_params(model), saved[2])
    assert accelerator.save_iteration == 0
    # checkpoint_0 exists: the save stops before writing or removing anything (total_limit included)
    # and says what to set.
    with pytest.raises(ValueError, match=r"checkpoint_0 \(0\) already exists") as error:
        accelerator.save_state()
    message = str(error.value)
    assert "nothing was written or removed" in message
    assert "project_configuration.iteration = 3" in message and "continue_numbering_on_load=True" in message
    assert _listing(tmp_path) == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    accelerator.project_configuration.iteration = 3  # what the message says to set
    assert os.path.basename(accelerator.save_state()) == "checkpoint_3"
    assert _listing(tmp_path) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]


def test_a_save_below_the_newest_checkpoint_stops_instead_of_hiding_behind_it(tmp_path) -> None:
    # total_limit removed checkpoint_0, so nothing collides; the documented system writes checkpoint_0 here,
    # which load_state() never takes (checkpoint_2 is newer) and total_limit deletes first.
    _three_saves(tmp_path, total_limit=2)
    accelerator, _ = _accelerator(tmp_path, seed=5, total_limit=2)
    accelerator.load_state()
    with pytest.raises(ValueError, match=r"checkpoint_0 \(0\) would be older than the newest checkpoint") as error:
        accelerator.save_state()
    assert "project_configuration.iteration = 3" in str(error.value)
    assert _listing(tmp_path) == ["checkpoint_1", "checkpoint_2"]
    assert accelerator.save_iteration == 0


def test_a_fresh_project_starts_at_checkpoint_0_after_loading_another_one(tmp_path) -> None:
    saved = _three_saves(tmp_path / "other")
    accelerator, model = _accelerator(tmp_path / "mine", seed=5)
    accelerator.load_state(tmp_path / "other" / "checkpoints" / "checkpoint_1")
    assert torch.equal(flat_params(model), saved[1])
    assert accelerator.save_iteration == 0
    assert os.path.basename(accelerator.save_state()) == "checkpoint_0"
    assert _listing(tmp_path / "mine") == ["checkpoint_0"]
    assert _listing(tmp_path / "other") == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]


def test_continue_numbering_on_load_follows_the_loaded_checkpoint(tmp_path) -> None:
    saved = _three_saves(tmp_path)
    accelerator, model = _accelerator(tmp_path, seed=5, total_limit=2, continue_numbering_on_load=True)
    accelerator.load_state()
    assert torch.equal(flat_params(model), saved[2])
    assert accelerator.save_iteration == 3
    assert os.path.basename(accelerator.save_state()) == "checkpoint_3"
    assert _listing(tmp_path) == ["checkpoint_2", "checkpoint_3"]
    accelerator.load_state(tmp_path / "checkpoints" / "checkpoint_2")  # an older one: the numbering never goes back
    assert accelerator.save_iteration == 4


def test_continue_numbering_on_load_ignores_other_names_and_failed_loads(tmp_path) -> None:
    accelerator, _ = _accelerator(tmp_path / "run", continue_numbering_on_load=True)
    shutil.copytree(accelerator.save_state(), tmp_path / "best")  # a checkpoint under a name of one's own
    assert accelerator.save_iteration == 1
    accelerator.load_state(tmp_path / "best")
    assert accelerator.save_iteration == 1
    (tmp_path / "elsewhere" / "checkpoint_7").mkdir(parents=True)
    with pytest.raises(CheckpointMismatchError):
        accelerator.load_state(tmp_path / "elsewhere" / "checkpoint_7")  # empty: nothing loaded
    assert accelerator.save_iteration == 1


def test_continue_numbering_on_load_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="continue_numbering_on_load must be a bool, got 'yes'"):
        ProjectConfiguration(continue_numbering_on_load="yes")  # type: ignore[arg-type]
    assert ProjectConfiguration().continue_numbering_on_load is False

"""``save_state`` into an explicit folder under DDP needs no other process (issue 25): diffusers' examples
call it on the main process only, and the other processes train on meanwhile. Two real gloo processes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from train_helpers import TinyNet, flat_params, regression_dataset

from accel_state.testing import DistributedPool, reset_shared_state


def _prepared(**kwargs):
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(**kwargs)
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(regression_dataset(48), batch_size=4)
    return accelerator, *accelerator.prepare(model, optimizer, loader)


def _train(accelerator, model, optimizer, loader, steps: int) -> None:
    for _, (x, y) in zip(range(steps), loader):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()


# -- rank functions (module level: DistributedPool runs them by name) -------------------------------


def rank_save_on_main_only(folder: str, accumulation: int) -> dict:
    accelerator, model, optimizer, loader = _prepared(gradient_accumulation_steps=accumulation)
    _train(accelerator, model, optimizer, loader, 3)
    saved = flat_params(accelerator.unwrap_model(model))
    if accelerator.is_main_process:
        accelerator.save_state(folder)
    _train(accelerator, model, optimizer, loader, 3)  # collectives of the other process meanwhile: no hang
    accelerator.wait_for_everyone()
    files = sorted(os.listdir(folder))
    accelerator.load_state(folder)  # every process loads; the other one has no random states there
    loaded = flat_params(accelerator.unwrap_model(model))
    accelerator.wait_for_everyone()
    reset_shared_state()
    return {"saved": saved, "loaded": loaded, "files": files}


def rank_save_on_every_process(folder: str) -> dict:
    accelerator, model, optimizer, loader = _prepared()
    _train(accelerator, model, optimizer, loader, 2)
    for _ in range(5):  # each save replaces the one before, maybe while the other process still adds files to it
        accelerator.save_state(folder)
    after_save = torch.rand(3)
    accelerator.wait_for_everyone()
    files = sorted(os.listdir(folder))
    _train(accelerator, model, optimizer, loader, 2)
    accelerator.load_state(folder)
    after_load = torch.rand(3)
    reset_shared_state()
    return {"files": files, "after_save": after_save, "after_load": after_load}


# -- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accumulation", [1, 2])
def test_save_state_on_the_main_process_only_does_not_wait_for_the_others(
    dist_pool: DistributedPool, tmp_path, accumulation: int
) -> None:
    folder = str(tmp_path / "checkpoint-3")
    results = dist_pool.run(rank_save_on_main_only, folder, accumulation)
    files = results[0]["files"]
    assert "random_states_0.safetensors" in files and "random_states_1.safetensors" not in files
    assert {"model.safetensors", "optimizer.bin", "accel_checkpoint.json"} <= set(files)
    assert json.loads((tmp_path / "checkpoint-3" / "accel_checkpoint.json").read_text())["process_files"] == "callers"
    for rank in (0, 1):
        assert torch.equal(results[rank]["loaded"], results[0]["saved"]), rank
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3"]  # no partial folder left behind


def test_save_state_on_every_process_adds_each_ones_random_states(dist_pool: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    results = dist_pool.run(rank_save_on_every_process, folder)
    assert {"random_states_0.safetensors", "random_states_1.safetensors"} <= set(results[0]["files"])
    assert not [name for name in results[0]["files"] if name.endswith(".partial")]
    for rank in (0, 1):
        assert torch.equal(results[rank]["after_load"], results[rank]["after_save"]), rank
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_without_a_process_group_the_store_error_names_the_launcher() -> None:
    from accel_train.components.checkpointer import _default_store

    with pytest.raises(RuntimeError, match="start the processes with a launcher"):
        _default_store()


def test_only_a_save_by_its_callers_may_lack_a_process_random_states(tmp_path) -> None:
    from accel_train import checkpointing as ckpt

    expected = dict(num_models=0, num_optimizers=0, num_schedulers=0, num_dataloaders=0, num_custom=0)
    common = dict(has_scaler=False, process_index=1, num_processes=2, **expected)
    with pytest.raises(
        ckpt.CheckpointMismatchError, match=r"random_states_1\.safetensors \(random states of process 1\)"
    ):
        ckpt.check_contents(str(tmp_path), manifest={"num_processes": 2}, **common)
    assert ckpt.check_contents(str(tmp_path), manifest={"num_processes": 2, "process_files": "callers"}, **common) == []

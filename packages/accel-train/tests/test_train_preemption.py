"""Saving on preemption (``ProjectConfiguration.save_on_preemption``): SIGTERM ends the run at the next
step with a checkpoint that resumes exactly, on one process and on two real gloo processes."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from train_helpers import TinyNet, flat_params, regression_dataset

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.plugins import ProjectConfiguration
from accel_train.preemption import PREEMPTION_EXIT_CODE, PreemptionWatch, rewind_loader_state


def test_save_on_preemption_needs_automatic_naming_that_continues_on_load() -> None:
    with pytest.raises(ValueError, match="automatic_checkpoint_naming"):
        ProjectConfiguration(project_dir="p", save_on_preemption=True)
    with pytest.raises(TypeError, match="save_on_preemption must be a bool"):
        ProjectConfiguration(project_dir="p", automatic_checkpoint_naming=True, save_on_preemption="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="save_on_preemption needs continue_numbering_on_load=True"):
        ProjectConfiguration(project_dir="p", automatic_checkpoint_naming=True, save_on_preemption=True)
    assert ProjectConfiguration(
        project_dir="p", automatic_checkpoint_naming=True, save_on_preemption=True, continue_numbering_on_load=True
    )


def test_watch_records_sigterm_and_restores_the_previous_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    watch = PreemptionWatch()
    assert watch.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.requested and watch.signal_name == "SIGTERM"
    finally:
        watch.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


def test_rewind_takes_back_the_batch_of_the_step_not_run() -> None:
    state = {"epoch": 1, "batches_yielded": 4, "generator_states": []}
    assert rewind_loader_state(state)["batches_yielded"] == 3 and state["batches_yielded"] == 4
    assert rewind_loader_state({"batches_yielded": 0})["batches_yielded"] == 0


def _train(project: str, total: int, preempt_after: int | None, sigterm_rank: int = 0) -> tuple[torch.Tensor, int]:
    """Train ``total`` batches (accumulation 2) with save_on_preemption; SIGTERM to this process after
    batch ``preempt_after`` (on rank ``sigterm_rank``). Returns the parameters and the batches run."""
    from accel_state.random import set_seed
    from accel_train import Accelerator

    reset_shared_state()
    config = ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, save_on_preemption=True, continue_numbering_on_load=True
    )
    from accel_data import DataLoaderConfiguration

    # Resumed without skipping by hand: the loader opts in to continuing at the saved batch.
    stateful = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(gradient_accumulation_steps=2, project_config=config, dataloader_config=stateful)
    set_seed(3)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_dataset(40), batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    done = 0
    if os.path.isdir(os.path.join(project, "checkpoints")):
        accelerator.load_state()
        done = accelerator.step  # batches run so far (the loader resumes at the next one)
    try:
        while done < total:
            for x, y in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                    optimizer.step()
                    optimizer.zero_grad()
                done += 1
                if done == preempt_after and accelerator.process_index == sigterm_rank:
                    os.kill(os.getpid(), signal.SIGTERM)
                if done == total:
                    break
    except SystemExit as stop:
        assert stop.code == PREEMPTION_EXIT_CODE
        return flat_params(accelerator.unwrap_model(model)), done
    finally:
        if accelerator._preemption is not None:
            accelerator._preemption.uninstall()
    return flat_params(accelerator.unwrap_model(model)), done


def test_preempted_run_saves_and_resumes_exactly(tmp_path) -> None:
    total = 15  # one epoch is 20 batches: accelerator.step counts the batches of this epoch
    reference, _ = _train(str(tmp_path / "reference"), total, None)
    project = str(tmp_path / "preempted")
    _, stopped_at = _train(project, total, preempt_after=7)
    assert stopped_at == 7  # the step running when the signal came finished; the next did not start
    assert os.listdir(os.path.join(project, "checkpoints")) == ["checkpoint_0"]
    _, stopped_at = _train(project, total, preempt_after=11)  # preempted again: the next number, not a collision
    assert stopped_at == 11
    assert sorted(os.listdir(os.path.join(project, "checkpoints"))) == ["checkpoint_0", "checkpoint_1"]
    resumed, done = _train(project, total, None)
    assert done == total
    assert torch.equal(resumed, reference)


def rank_preempted(project: str, total: int, preempt_after: int | None) -> tuple[list[float], int]:
    params, done = _train(project, total, preempt_after, sigterm_rank=1)
    return params.tolist(), done


def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step(dist_pool: DistributedPool, tmp_path) -> None:
    total = 9  # 40 samples, 2 per batch, 2 ranks: 10 batches per epoch on each rank
    project = str(tmp_path / "two")
    reference = dist_pool.run(rank_preempted, str(tmp_path / "reference"), total, None)
    stopped = dist_pool.run(rank_preempted, project, total, 4)
    assert [done for _, done in stopped] == [4, 4]  # rank 0 never received the signal, yet stopped with rank 1
    assert sorted(os.listdir(os.path.join(project, "checkpoints"))) == ["checkpoint_0"]
    resumed = dist_pool.run(rank_preempted, project, total, None)
    assert [done for _, done in resumed] == [total, total]
    assert [params for params, _ in resumed] == [params for params, _ in reference]

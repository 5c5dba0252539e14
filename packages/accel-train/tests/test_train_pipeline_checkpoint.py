"""Pipeline-parallel checkpoints (``ParallelismConfig(pp_size=2)``) on two real gloo processes.

* A crafted pickle planted as the ``.metadata`` of the model's or the optimizer's DCP folder is refused
  by name on both processes before anything is unpickled or loaded (the marker it would write never
  appears; model and optimizer keep their values), and the genuine folder still loads after.
* A resumed run continues exactly like the uninterrupted one (Adam, a scheduler that changed the
  learning rate): after ``load_state`` in the same process, and in a fresh process group with a
  differently initialised model. The optimizer's hyper-parameters survive, and it steps.
"""

from __future__ import annotations

import os
import pickle
import shutil
from typing import Any

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state

SAVE_AT = 3  # optimizer steps before the save
AFTER = 2  # optimizer steps after it


def _net(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of optimizer step ``step`` (the same in every run and on both stages)."""
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(4, 4, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def _prepared(seed: int) -> tuple[Any, Any, Any, Any]:
    """A 2-stage Accelerator with the model (initialised from ``seed``), Adam and a step scheduler."""
    from accel_train import Accelerator, PipelineParallelConfig
    from accel_train.parallelism_config import ParallelismConfig

    handler = PipelineParallelConfig(num_microbatches=2, loss_fn=_mse)
    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler), step_scheduler_with_optimizer=False
    )
    model = _net(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return accelerator, *accelerator.prepare(model, optimizer, scheduler)


def _train(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, steps: range) -> None:
    for step in steps:
        x, y = _batch(step)
        accelerator.backward(model(x, target=y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _params(model: Any) -> list[torch.Tensor]:
    return [param.detach().clone() for param in model.parameters()]


def _moments(optimizer: Any) -> list[torch.Tensor]:
    return [v.detach().clone() for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


def _groups(optimizer: Any) -> list[dict[str, Any]]:
    """The hyper-parameters of each parameter group (what a resume must restore)."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


class _Exploit:
    """A pickle that writes ``marker`` when it is unpickled by a reader that runs code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- pure logic: the optimizer groups, the folder checks and the swap know the pipeline's entries ---------


def _metadata(*keys: str) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(state_dict_metadata=dict.fromkeys(keys))


def test_group_hyper_parameters_are_written_once_and_given_back_to_each_stage() -> None:
    from accel_train.strategies.pipeline.checkpoint import (
        check_saved_groups,
        stage_groups_for_checkpoint,
        stage_groups_from_checkpoint,
    )

    current = {"state": {"0.weight": {}}, "param_groups": [{"lr": 0.01, "eps": 1e-8, "params": ["0.weight"]}]}
    written = stage_groups_for_checkpoint(current)
    assert written["param_groups"] == [{"lr": 0.01, "eps": 1e-8}] and written["state"] is current["state"]
    # a setting the checkpoint lacks (added by a newer torch) keeps its current value
    metadata = _metadata("state.0.weight.step", "param_groups.0.lr", "param_groups.0.params")
    to_read = check_saved_groups(metadata, written, "ckpt/optimizer_pp_0")
    assert to_read["param_groups"] == [{"lr": 0.01}]
    to_read["param_groups"][0]["lr"] = 0.005  # as read from the checkpoint
    restored = stage_groups_from_checkpoint(to_read, current)
    assert restored["param_groups"] == [{"lr": 0.005, "eps": 1e-8, "params": ["0.weight"]}]


def test_another_number_of_parameter_groups_is_refused_by_name() -> None:
    from accel_train.strategies.pipeline.checkpoint import check_saved_groups

    state = {"state": {}, "param_groups": [{"lr": 0.1}, {"lr": 0.2}]}
    with pytest.raises(ValueError, match=r"ckpt/optimizer_pp_0 holds 1 parameter group\(s\) but this optimizer has 2"):
        check_saved_groups(_metadata("param_groups.0.lr"), state, "ckpt/optimizer_pp_0")


def test_the_folder_checks_look_into_the_entries_of_the_strategy_that_reads(tmp_path) -> None:
    from accel_state.errors import UnsafeCheckpointError
    from accel_train.checkpoint.file_io import CheckpointIO
    from accel_train.checkpointing import check_folder
    from accel_train.strategies.pipeline.strategy import CHECKPOINT_ENTRIES

    marker = str(tmp_path / "marker")
    (tmp_path / "ckpt" / "optimizer_pp_0").mkdir(parents=True)
    (tmp_path / "ckpt" / "optimizer_pp_0" / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    check_folder(str(tmp_path / "ckpt"), CheckpointIO())  # no strategy entries: a folder of the user's
    with pytest.raises(UnsafeCheckpointError, match=r"optimizer_pp_0/\.metadata.*GLOBAL builtins\.exec"):
        check_folder(str(tmp_path / "ckpt"), CheckpointIO(), entries=CHECKPOINT_ENTRIES)
    assert not os.path.exists(marker)


def test_a_new_save_does_not_carry_the_previous_pipeline_entries_along(tmp_path) -> None:
    from accel_train.checkpointing import publish
    from accel_train.strategies.pipeline.strategy import CHECKPOINT_ENTRIES

    def save(name: str) -> str:
        tmp = tmp_path / f".{name}.partial"
        (tmp / "pytorch_model_pp_0").mkdir(parents=True)
        return str(tmp)

    final = tmp_path / "ckpt"
    for entry in ("pytorch_model_pp_0", "optimizer_pp_1"):
        (final / entry).mkdir(parents=True)
    (final / "notes.txt").write_text("the user's")
    publish(save("first"), str(final), CHECKPOINT_ENTRIES)
    assert sorted(os.listdir(final)) == ["notes.txt", "pytorch_model_pp_0"]  # the user's file stays
    (final / "optimizer_pp_1").mkdir()
    publish(save("second"), str(final))  # without the strategy's entries it is taken for the user's
    assert sorted(os.listdir(final)) == ["notes.txt", "optimizer_pp_1", "pytorch_model_pp_0"]


# -- a planted .metadata is refused by name on every stage ----------------------------------------------


def rank_planted_metadata(folder: str, marker: str) -> list[dict[str, Any]]:
    """Save, then load copies whose model or optimizer ``.metadata`` is a crafted pickle."""
    import torch.distributed as dist

    reset_shared_state()
    accelerator, model, optimizer, scheduler = _prepared(seed=0)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT))
    accelerator.save_state(folder)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT, SAVE_AT + 1))  # a load would show
    results = []
    for entry in ("pytorch_model_pp_0", "optimizer_pp_0"):
        crafted = f"{folder}_{entry}"
        if accelerator.is_main_process:
            shutil.copytree(folder, crafted)
            with open(os.path.join(crafted, entry, ".metadata"), "wb") as handle:
                pickle.dump(_Exploit(marker), handle)
        dist.barrier()
        before = _params(model) + _moments(optimizer)
        try:
            accelerator.load_state(crafted)
            error = ""
        except Exception as raised:
            error = f"{type(raised).__name__}: {raised}"
        after = _params(model) + _moments(optimizer)
        results.append(
            {
                "entry": entry,
                "error": error,
                "unchanged": all(torch.equal(a, b) for a, b in zip(before, after)),
                "ran": os.path.exists(marker),
            }
        )
    accelerator.load_state(folder)  # nothing is left hanging: the genuine folder loads, and steps
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT, SAVE_AT + 1))
    return results


def test_planted_metadata_is_refused_by_name_on_every_stage(dist_pool: DistributedPool, tmp_path) -> None:
    marker = str(tmp_path / "marker")
    on_rank = dist_pool.run(rank_planted_metadata, str(tmp_path / "ckpt"), marker)
    for first, second in zip(*on_rank):
        assert first["error"] == second["error"], (first, second)  # the same verdict on both stages
    for result in on_rank[0] + on_rank[1]:
        assert result["error"].startswith("UnsafeCheckpointError"), result
        assert f"{result['entry']}/.metadata" in result["error"] and "GLOBAL builtins.exec" in result["error"]
        assert result["unchanged"] and not result["ran"], result
    assert not os.path.exists(marker)


# -- an exact resume --------------------------------------------------------------------------------------


def _fresh_process_group() -> None:
    """Tear down the process group and forget the shared state; the next Accelerator starts a new group, on
    a port agreed now (the old group's store may still answer on the old one while the other rank leaves)."""
    import torch.distributed as dist

    from accel_state.state import AcceleratorState
    from accel_state.testing import free_port

    port = [free_port()]
    dist.broadcast_object_list(port, src=0)
    AcceleratorState.destroy_process_group()
    reset_shared_state()
    os.environ["MASTER_PORT"] = str(port[0])


def rank_resume(folder: str) -> dict[str, Any]:
    """Train SAVE_AT steps, save, train AFTER more; resume from the save in this process, and in a fresh
    process group with another initial model, and train the same AFTER steps."""
    reset_shared_state()
    accelerator, model, optimizer, scheduler = _prepared(seed=0)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT))
    accelerator.save_state(folder)
    saved_groups = _groups(optimizer)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT, SAVE_AT + AFTER))
    straight = _params(model)

    accelerator.load_state(folder)  # the same process, an optimizer that already holds state
    same_process_groups = _groups(optimizer)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT, SAVE_AT + AFTER))
    same_process = _params(model)

    _fresh_process_group()
    accelerator, model, optimizer, scheduler = _prepared(seed=1)  # a fresh process group and model
    initial = _params(model)
    accelerator.load_state(folder)
    fresh_groups = _groups(optimizer)
    _train(accelerator, model, optimizer, scheduler, range(SAVE_AT, SAVE_AT + AFTER))
    return {
        "saved_groups": saved_groups,
        "same_process_groups": same_process_groups,
        "fresh_groups": fresh_groups,
        "straight": straight,
        "same_process": same_process,
        "fresh": _params(model),
        "fresh_initial": initial,
    }


def test_resume_continues_exactly_like_the_uninterrupted_run(dist_pool: DistributedPool, tmp_path) -> None:
    for result in dist_pool.run(rank_resume, str(tmp_path / "ckpt")):
        assert result["saved_groups"][0]["lr"] == pytest.approx(0.005)  # the scheduler changed it
        assert result["saved_groups"][0]["betas"] == (0.8, 0.99)
        assert result["same_process_groups"] == result["saved_groups"]
        assert result["fresh_groups"] == result["saved_groups"]
        assert not all(torch.equal(a, b) for a, b in zip(result["fresh_initial"], result["straight"]))
        for resumed in ("same_process", "fresh"):
            assert len(result[resumed]) == len(result["straight"]) > 0
            assert all(torch.equal(a, b) for a, b in zip(result[resumed], result["straight"])), resumed

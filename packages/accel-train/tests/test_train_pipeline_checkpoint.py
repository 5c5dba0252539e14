"""Pipeline-parallel checkpoints (``ParallelismConfig(pp_size=2)``).

* The checks ``load_state`` runs first look into the pipeline's folders, and a new save does not carry the
  previous save's pipeline entries along.
* On two real gloo processes, a crafted pickle planted as the ``.metadata`` of the model's or the
  optimizer's DCP folder is refused by name on both processes before anything is unpickled or loaded
  (the marker it would write never appears; model and optimizer keep their values), and the genuine
  folder still loads after.
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


class _Exploit:
    """A pickle that writes ``marker`` when it is unpickled by a reader that runs code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- the folder checks and the swap know the pipeline's entries -------------------------------------


def test_the_folder_checks_look_into_the_entries_of_the_strategy_that_reads(tmp_path) -> None:
    from accel_state.errors import UnsafeCheckpointError
    from accel_train.checkpoint_io import CheckpointIO
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
    accelerator.load_state(folder)  # nothing is left hanging: the genuine folder loads
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

"""Pipeline parallelism: stage cuts, settings, and training on real gloo processes (2 stages x 1, and
2 stages x 2 data-parallel) against the same model trained on one process."""

from __future__ import annotations

import os
import types

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.parallelism_config import ParallelismConfig
from accel_train.strategies import strategy_name
from accel_train.strategies.pipeline import PipelineParallelConfig, PipelineSchedule
from accel_train.strategies.pipeline.split import stage_bounds, stage_module


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 1),
    )


def _data(n: int = 96) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def _single_run(global_batch: int, steps: int, accumulation: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The reference: the whole model on one process, plain PyTorch."""
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = _data().tensors
    losses = []
    for step in range(steps):
        window = slice(step * global_batch, (step + 1) * global_batch)
        loss = _mse(model(x[window]), y[window])
        (loss / accumulation).backward()
        if (step + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- pure logic -----------------------------------------------------------------------------------------


def test_stages_balance_parameters_and_keep_child_names() -> None:
    model = _net()
    bounds = stage_bounds(model, 2)
    assert bounds[0] == 0 and bounds[-1] == 7 and len(bounds) == 3
    first, second = stage_module(model, bounds, 0), stage_module(model, bounds, 1)
    names = list(first.state_dict()) + list(second.state_dict())
    assert names == list(model.state_dict())
    assert first[0] is model[0]  # the same modules, not copies
    assert stage_bounds(model, 3, split_points=[2, 4]) == [0, 2, 4, 7]


def test_bad_cuts_say_what_to_change() -> None:
    with pytest.raises(TypeError, match="splits an nn.Sequential.*got Linear"):
        stage_bounds(torch.nn.Linear(2, 2), 2)
    with pytest.raises(ValueError, match="2 children and cannot be split into 3"):
        stage_bounds(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), 3)
    with pytest.raises(ValueError, match=r"split_points=\[9\] must give 1 increasing child indices in 1..6"):
        stage_bounds(_net(), 2, split_points=[9])


def test_settings_are_parsed_once() -> None:
    assert PipelineParallelConfig(schedule="GPipe").schedule is PipelineSchedule.GPIPE
    assert PipelineParallelConfig().schedule is PipelineSchedule.ONE_F_ONE_B
    with pytest.raises(ValueError, match="pipeline schedule 'zb' is not known; choose one of"):
        PipelineParallelConfig(schedule="zb")
    with pytest.raises(ValueError, match="num_microbatches must be an int >= 1"):
        PipelineParallelConfig(num_microbatches=0)
    with pytest.raises(ValueError, match="split_points must be increasing"):
        PipelineParallelConfig(split_points=[3, 1])


def test_pp_size_picks_the_pipeline_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_state.enums import DistributedType

    config = ParallelismConfig(pp_size=2, dp_replicate_size=2)
    assert config.total_size == 4 and not config.is_trivial
    assert isinstance(config.pp_handler, PipelineParallelConfig)
    assert strategy_name(DistributedType.MULTI_CPU, config) == "pipeline"
    monkeypatch.setenv("PARALLELISM_CONFIG_PP_SIZE", "2")
    assert ParallelismConfig().pp_size == 2
    with pytest.raises(ValueError, match="pp_size must be an int >= 1"):
        ParallelismConfig(pp_size=0)
    with pytest.raises(TypeError, match="pp_handler must be a PipelineParallelConfig"):
        ParallelismConfig(pp_size=2, pp_handler={"schedule": "gpipe"})


# -- on real processes ----------------------------------------------------------------------------------


def rank_train(
    sizes: dict, schedule: str, steps: int, per_rank_batch: int, accumulation: int, folder: str | None
) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    handler = PipelineParallelConfig(schedule=schedule, num_microbatches=4, loss_fn=_mse)
    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(pp_handler=handler, **sizes), gradient_accumulation_steps=accumulation
    )
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_data(), batch_size=per_rank_batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        with accelerator.accumulate(model):
            loss = model(x, target=y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(accelerator.reduce(loss, "mean").item())
    result = {
        "losses": losses,
        "state": accelerator.get_state_dict(model),
        # the rank along whichever data-parallel dimension is active (data_parallel_rank is dp_replicate's)
        "dims": (
            accelerator.data_parallel_rank + accelerator.data_parallel_shard_rank,
            accelerator._strategy.parallel_dims.pp_rank,
        ),
        "eval": None,
    }
    with torch.no_grad():
        x, _ = _data().tensors
        result["eval"] = model(x[:8]).clone()
    if folder is not None:
        accelerator.save_state(folder)
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
        accelerator.load_state(folder)
        result["reloaded"] = accelerator.get_state_dict(model)
    return result


def _check(results: list[dict], global_batch: int, steps: int, accumulation: int = 1) -> None:
    ref_losses, ref_state = _single_run(global_batch, steps, accumulation)
    model = _net()
    model.load_state_dict(ref_state)
    with torch.no_grad():
        ref_eval = model(_data().tensors[0][:8])
    for result in results:
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5)
        assert set(result["state"]) == set(ref_state)
        for key, value in ref_state.items():
            torch.testing.assert_close(result["state"][key], value, atol=1e-5, rtol=0)
        torch.testing.assert_close(result["eval"], ref_eval, atol=1e-5, rtol=0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_train_like_one_process(dist_pool: DistributedPool, schedule: str, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    results = dist_pool.run(rank_train, {"pp_size": 2}, schedule, 5, 8, 1, folder)
    _check(results, global_batch=8, steps=5)
    assert [r["dims"] for r in results] == [(0, 0), (0, 1)]
    for result in results:
        for key, value in result["state"].items():
            torch.testing.assert_close(result["reloaded"][key], value, atol=0, rtol=0)
    assert {"pytorch_model_pp_0", "optimizer_pp_0"} <= set(os.listdir(folder))
    from accel_train.merge import merge_fsdp_weights

    merged = merge_fsdp_weights(os.path.join(folder, "pytorch_model_pp_0"), str(tmp_path / "merged"))
    from safetensors.torch import load_file

    weights = load_file(merged)
    for key, value in results[0]["state"].items():
        torch.testing.assert_close(weights[key], value, atol=0, rtol=0)


@pytest.mark.parametrize("dp", ["dp_replicate_size", "dp_shard_size"])
def test_two_stages_by_two_data_parallel_with_accumulation(pool4: DistributedPool, dp: str, tmp_path) -> None:
    folder = str(tmp_path / "ckpt") if dp == "dp_shard_size" else None
    results = pool4.run(rank_train, {"pp_size": 2, dp: 2}, "1f1b", 6, 4, 2, folder)
    _check(results, global_batch=8, steps=6, accumulation=2)
    assert sorted(r["dims"] for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for result in results:
        for key, value in result.get("reloaded", result["state"]).items():
            torch.testing.assert_close(value, result["state"][key], atol=0, rtol=0)


def test_what_the_pipeline_does_not_combine_with_is_refused_by_name() -> None:
    from accel_train.strategies.pipeline.strategy import PipelineStrategy

    def state(**sizes):
        return types.SimpleNamespace(parallelism_config=ParallelismConfig(**sizes), num_processes=4)

    PipelineStrategy.validate(state(pp_size=2, dp_replicate_size=2), None, "bf16")
    with pytest.raises(NotImplementedError, match=r"dp_shard_size only; \{'tp_size': 2\}"):
        PipelineStrategy.validate(state(pp_size=2, tp_size=2), None, "no")
    with pytest.raises(NotImplementedError, match="one data-parallel dimension"):
        PipelineStrategy.validate(
            types.SimpleNamespace(
                parallelism_config=ParallelismConfig(pp_size=2, dp_replicate_size=2, dp_shard_size=2), num_processes=8
            ),
            None,
            "no",
        )
    with pytest.raises(ValueError, match="mixed_precision='fp16' needs a gradient scaler"):
        PipelineStrategy.validate(state(pp_size=2, dp_replicate_size=2), None, "fp16")
    with pytest.raises(ValueError, match="multiply to 2"):
        PipelineStrategy.validate(state(pp_size=2), None, "no")
    fsdp = state(pp_size=2, dp_replicate_size=2)
    fsdp.fsdp_plugin = object()
    with pytest.raises(ValueError, match="cannot be combined with the fsdp_plugin"):
        PipelineStrategy.validate(fsdp, None, "no")


def rank_bad_calls() -> list[str]:
    reset_shared_state()
    from accel_train import Accelerator

    handler = PipelineParallelConfig(num_microbatches=4)
    accelerator = Accelerator(parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler))
    model = accelerator.prepare(_net())
    x, y = _data().tensors
    errors = []
    for call in (
        lambda: model(x[:6], target=y[:6], loss_fn=_mse),
        lambda: model(x[:8], target=y[:8]),
        lambda: accelerator.backward(_mse(torch.zeros(1, requires_grad=True), torch.ones(1))),
    ):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_calls_say_what_to_change(dist_pool: DistributedPool) -> None:
    for errors in dist_pool.run(rank_bad_calls):
        assert len(errors) == 3
        assert "6 samples, which do not split into 4 equal micro-batches" in errors[0]
        assert "give loss_fn in PipelineParallelConfig(loss_fn=...)" in errors[1]
        assert "pass to accelerator.backward the loss returned by the prepared model" in errors[2]

"""DeepSpeed on two real gloo processes (CPU): ZeRO 1-3 against DDP, checkpoints, config-defined
optimizers, CPU offload, and two plugins (teacher / student).

DeepSpeed compiles its small C++ ops on first use (cached in ~/.cache/torch_extensions), so these
tests share one pool of processes and use torch optimizers except in the offload test.
"""

from __future__ import annotations

import pytest
import torch
from train_helpers import regression_dataset

from accel_state.imports import is_deepspeed_available
from accel_state.testing import DistributedPool, reset_shared_state

pytestmark = pytest.mark.skipif(
    not is_deepspeed_available(), reason='needs DeepSpeed: pip install "accel-train[deepspeed]"'
)

STEPS = 6
BATCH = 4


@pytest.fixture(scope="module")
def ds_pool():
    with DistributedPool(world_size=2, timeout=400) as pool:
        yield pool


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _loader(batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(regression_dataset(2 * batch * STEPS), batch_size=batch)


def _train(accelerator, model, optimizer, loader, scheduler=None, steps: int | None = None) -> None:
    for index, (x, y) in enumerate(loader):
        if steps is not None and index >= steps:
            break
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()


def _full_state(accelerator, model) -> dict:
    return {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}


# -- rank functions -------------------------------------------------------------------------------


def rank_ddp_reference(accumulation: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader)
    return _full_state(accelerator, model)


def rank_zero_training(stage: int, accumulation: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.deepspeed_utils import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper

    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=accumulation)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader)
    strategy = accelerator._strategy
    return {
        "state": _full_state(accelerator, model),
        "engine": type(model).__name__,
        "optimizer": type(optimizer).__name__,
        "wrapper": isinstance(strategy.engine_wrapper, DeepSpeedEngineWrapper)
        and isinstance(optimizer, DeepSpeedOptimizerWrapper),
        "config": {
            "micro": plugin.deepspeed_config["train_micro_batch_size_per_gpu"],
            "total": plugin.deepspeed_config["train_batch_size"],
            "accumulation": plugin.deepspeed_config["gradient_accumulation_steps"],
            "stage": model.zero_optimization_stage(),
        },
        "unwrapped": type(accelerator.unwrap_model(model)).__name__,
    }


@pytest.mark.parametrize(("stage", "accumulation"), [(1, 1), (2, 2), (3, 1)])
def test_zero_stages_train_like_ddp(ds_pool: DistributedPool, stage: int, accumulation: int) -> None:
    reference = ds_pool.run(rank_ddp_reference, accumulation)
    results = ds_pool.run(rank_zero_training, stage, accumulation)
    for rank, result in enumerate(results):
        assert result["engine"] == "DeepSpeedEngine"
        assert result["wrapper"]
        assert result["unwrapped"] == "Sequential"
        assert result["config"] == {
            "micro": BATCH,
            "total": BATCH * accumulation * 2,
            "accumulation": accumulation,
            "stage": stage,
        }
        assert result["state"].keys() == reference[rank].keys()
        for key, value in result["state"].items():
            torch.testing.assert_close(value, reference[rank][key], atol=1e-5, rtol=0)
    initial = _model().state_dict()
    assert any(not torch.allclose(initial[k], results[0]["state"][k]) for k in initial), "training changed nothing"

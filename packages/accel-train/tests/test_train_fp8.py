"""mixed_precision="fp8" through accel-quant: torchao trains on CPU for real; the other backends' errors."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from train_helpers import fp8_mlp

from accel_train import Accelerator
from accel_train.kwargs_handlers import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs

requires_torchao = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="torchao is not installed (accel-quant[torchao])"
)


def _train(accelerator: Accelerator, model: torch.nn.Module, steps: int = 60) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(128, 32, generator=generator)
    targets = inputs @ torch.randn(32, 16, generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # an optimizer built before prepare() ends up on the model's (possibly new) parameters
    in_optimizer = {id(p) for group in optimizer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters()}
    return losses


@requires_torchao
def test_fp8_with_torchao_trains_on_cpu() -> None:
    from torchao.float8.float8_linear import Float8Linear

    base = fp8_mlp()
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert accelerator.fp8_backend == "AO"
    model = copy.deepcopy(base)
    fp8_losses = _train(accelerator, model)
    converted = [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert converted == ["2", "4"]  # first and last Linear kept in high precision
    assert fp8_losses[-1] < 0.2 * fp8_losses[0]

    from accel_state.testing import reset_shared_state

    reset_shared_state()
    bf16_losses = _train(Accelerator(cpu=True, mixed_precision="bf16"), copy.deepcopy(base))
    assert fp8_losses[-1] == pytest.approx(bf16_losses[-1], rel=0.3)


@requires_torchao
def test_fp8_backend_from_launcher_environment(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    assert accelerator.fp8_backend == "AO"
    model = accelerator.prepare(fp8_mlp())
    assert any(type(m).__name__ == "Float8Linear" for m in model.modules())


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine installed")
def test_fp8_with_missing_transformer_engine_names_it() -> None:
    with pytest.raises(ImportError, match="transformer-engine"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    with pytest.raises(ImportError, match="transformer-engine"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[FP8RecipeKwargs(backend="te")])


@pytest.mark.skipif(importlib.util.find_spec("msamp") is not None, reason="MS-AMP installed")
def test_fp8_with_missing_msamp_names_it() -> None:
    with pytest.raises(ImportError, match="MS-AMP"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs()])


def test_two_fp8_recipes_are_refused() -> None:
    with pytest.raises(ValueError, match="several FP8 recipes"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(), TERecipeKwargs()])


def rank_fp8_fsdp2(all_gather: bool) -> dict:
    from accel_state.testing import reset_shared_state
    from accel_train.parallelism_config import ParallelismConfig

    reset_shared_state()
    accelerator = Accelerator(
        mixed_precision="fp8",
        parallelism_config=ParallelismConfig(dp_shard_size=2),
        kwargs_handlers=[AORecipeKwargs(enable_fsdp_float8_all_gather=all_gather)],
    )
    model = fp8_mlp()
    losses = _train(accelerator, model, steps=20)
    return {"losses": losses, "layers": [type(m).__name__ for m in model.modules()]}


@requires_torchao
@pytest.mark.parametrize("all_gather", [True, False], ids=["float8_all_gather", "bf16_all_gather"])
def test_fp8_with_torchao_under_fsdp2(dist_pool, all_gather: bool) -> None:
    results = dist_pool.run(rank_fp8_fsdp2, all_gather)
    assert results[0]["layers"].count("Float8Linear") == 2
    assert results[0]["losses"] == results[1]["losses"]  # one model, sharded over the two ranks
    # both ranks see the whole batch, so the run follows the single-process FP8 run
    single = _train(Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()]), fp8_mlp(), 20)
    assert results[0]["losses"][-1] < 0.9 * results[0]["losses"][0]
    assert results[0]["losses"][-1] == pytest.approx(single[-1], rel=0.02)


# -- FP8 with the FSDP strategy (fsdp_plugin, version 2; two gloo processes) ----------------------------------------------------------------


def rank_fp8_fsdp_plugin() -> dict:
    from accel_state.testing import reset_shared_state
    from accel_train import FullyShardedDataParallelPlugin

    reset_shared_state()
    accelerator = Accelerator(
        mixed_precision="fp8",
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        kwargs_handlers=[AORecipeKwargs()],
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(3)), torch.nn.Linear(64, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(accelerator.process_index))
    y = torch.randn(32, 16, generator=torch.Generator().manual_seed(9))
    losses = []
    for _ in range(12):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    layers = [type(m).__name__ for m in accelerator.unwrap_model(model)]
    return {"backend": accelerator.fp8_backend, "layers": layers, "losses": losses}


@requires_torchao
def test_fp8_trains_under_the_fsdp2_plugin(dist_pool) -> None:
    for result in dist_pool.run(rank_fp8_fsdp_plugin):
        assert result["backend"] == "AO"
        assert result["layers"] == ["Linear", "Float8Linear", "Float8Linear", "Linear"]  # first and last kept
        assert result["losses"][-1] < 0.5 * result["losses"][0]


@requires_torchao
def test_fp8_with_fsdp1_says_to_use_fsdp2() -> None:
    from accel_train import FullyShardedDataParallelPlugin

    with pytest.raises(ValueError, match="runs with FSDP2.*set fsdp_version=2"):
        Accelerator(cpu=True, mixed_precision="fp8", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))

"""mixed_precision="fp8" (torchao) under DeepSpeed ZeRO 1-3, on one and two real gloo processes: the
model trains with torchao's ``Float8Linear`` layers (emulated on CPU) and the engine in bf16, with a loss
close to the same FP8 model under DDP; combinations that cannot work are refused by name."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from train_helpers import fp8_mlp

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import DistributedPool, reset_shared_state

pytestmark = [
    pytest.mark.skipif(
        not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
    ),
    pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao (accel-quant[torchao])"),
]

STEPS = 8
BATCH = 8


def _loader(world: int) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(BATCH * STEPS * world, 32, generator=generator)
    targets = inputs @ torch.randn(32, 16, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=BATCH)


def _train(accelerator, world: int) -> dict:
    from torchao.float8.float8_linear import Float8Linear

    model = fp8_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader(world))
    dtype = next(p.dtype for p in model.parameters())  # the engine casts the model to bf16
    losses = []
    for _epoch in range(2):
        for inputs, targets in loader:
            out = model(inputs.to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    module = accelerator.unwrap_model(model)
    return {
        "losses": losses,
        "fp8_layers": sum(isinstance(m, Float8Linear) for m in module.modules()),
        "dtype": str(dtype),
        "mixed_precision": accelerator.state.mixed_precision,
    }


def rank_fp8(stages: tuple[int, ...]) -> dict:
    """The FP8 model under DDP (the reference), then under each ZeRO stage."""
    import os

    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.kwargs_handlers import AORecipeKwargs

    world = int(os.environ.get("WORLD_SIZE", "1"))
    results = {}
    reset_shared_state()
    results["ddp"] = _train(Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()]), world)
    for stage in stages:
        reset_shared_state()
        plugin = DeepSpeedPlugin(zero_stage=stage)
        accelerator = Accelerator(
            cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()], deepspeed_plugin=plugin
        )
        result = _train(accelerator, world)
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        result["engine_bf16"] = config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
        result["stage"] = config["zero_optimization"]["stage"]
        results[stage] = result
    reset_shared_state()
    return results


def _check(results: list[dict], stages: tuple[int, ...]) -> None:
    for rank_results in results:
        reference = rank_results["ddp"]
        assert reference["fp8_layers"] == 2  # first and last Linear stay high precision
        for stage in stages:
            result = rank_results[stage]
            assert (result["stage"], result["engine_bf16"], result["fp8_layers"]) == (stage, True, 2)
            assert result["mixed_precision"] == "fp8" and result["dtype"] == "torch.bfloat16"
            losses = result["losses"]
            assert len(losses) == 2 * STEPS
            assert sum(losses[STEPS:]) < sum(losses[:STEPS]), f"the second epoch has a lower loss: {losses}"
            # bf16 weights in the engine vs fp32 weights under autocast: close, not equal
            torch.testing.assert_close(
                torch.tensor(result["losses"]), torch.tensor(reference["losses"]), rtol=0.08, atol=0.02
            )


STAGES = (1, 2, 3)


def test_fp8_under_zero_1_to_3_on_one_process() -> None:
    with DistributedPool(world_size=1, timeout=600) as pool:
        _check(pool.run(rank_fp8, STAGES), STAGES)


def test_fp8_under_zero_1_to_3_on_two_processes() -> None:
    with DistributedPool(world_size=2, timeout=600) as pool:
        results = pool.run(rank_fp8, STAGES)
    _check(results, STAGES)
    assert results[0][3]["losses"] != results[1][3]["losses"], "each process trained on its own shard"


# -- refused by name (one process, nothing built) -------------------------------------------------------


def test_fp8_with_the_float8_all_gather_under_deepspeed_is_refused() -> None:
    reset_shared_state()
    from torchao.float8 import Float8LinearConfig

    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.kwargs_handlers import AORecipeKwargs

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    with pytest.raises(ValueError, match=r"enable_fsdp_float8_all_gather=True\) .*DeepSpeed partitions parameters"):
        Accelerator(
            cpu=True,
            mixed_precision="fp8",
            kwargs_handlers=[AORecipeKwargs(config=config)],
            deepspeed_plugin=DeepSpeedPlugin(zero_stage=2),
        )
    reset_shared_state()


def test_fp8_with_a_config_enabling_fp16_is_refused() -> None:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.kwargs_handlers import AORecipeKwargs

    plugin = DeepSpeedPlugin(hf_ds_config={"fp16": {"enabled": True}, "zero_optimization": {"stage": 1}})
    with pytest.raises(ValueError, match=r"fp8' under DeepSpeed runs what is not FP8 in bf16.*enables fp16"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()], deepspeed_plugin=plugin)
    reset_shared_state()


def test_fp8_precision_under_deepspeed_refuses_other_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_quant.fp8.backend as backend
    from accel_train.precisions.fp8 import EngineFP8Precision, FP8Precision

    # TransformerEngine chosen on a CUDA device (neither is here: the choice and its recipe stand in)
    monkeypatch.setattr(backend, "choose_fp8_backend", lambda explicit: "TE")
    monkeypatch.setattr(FP8Precision, "_build_recipe", lambda self, *args: None)
    with pytest.raises(ValueError, match=r"under DeepSpeed runs with the torchao backend.*not TE.*AORecipeKwargs"):
        EngineFP8Precision("fp8", torch.device("cuda"))

"""The Accelerator in one process: prepare, backward, accumulation, precision, wrappers, utilities."""

from __future__ import annotations

import json
import os

import pytest
import torch
from train_helpers import TinyNet, flat_params, regression_dataset

from accel_train import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    Accelerator,
    AutocastKwargs,
    BackendNotAvailableError,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    MegatronLMPlugin,
    ProfileKwargs,
)


def _model_and_optimizer(lr: float = 0.1) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def test_attributes_single_process() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.device == torch.device("cpu")
    assert accelerator.num_processes == 1 and accelerator.process_index == 0
    assert accelerator.is_main_process and accelerator.is_local_main_process and accelerator.is_last_process
    assert not accelerator.use_distributed
    assert accelerator.mixed_precision == "no"
    assert accelerator.sync_gradients
    assert accelerator.gradient_accumulation_steps == 1
    assert not accelerator.optimizer_step_was_skipped
    assert accelerator.distributed_type == "NO" and str(accelerator.distributed_type) == "DistributedType.NO"


def test_prepare_in_any_order_returns_same_order() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    prepared_scheduler, prepared_optimizer, prepared_model = accelerator.prepare(scheduler, optimizer, model)
    assert isinstance(prepared_scheduler, AcceleratedScheduler)
    assert isinstance(prepared_optimizer, AcceleratedOptimizer)
    assert prepared_scheduler.optimizers == [prepared_optimizer]
    assert prepared_model is model
    assert accelerator.prepare(prepared_optimizer) is prepared_optimizer  # preparing twice is harmless
    assert len(accelerator._optimizers) == 1
    passthrough = object()
    assert accelerator.prepare(passthrough) is passthrough


def test_device_placement_list_must_match() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ValueError, match="device_placement has 1 entries but 2 objects"):
        accelerator.prepare(model, optimizer, device_placement=[True])
    model2, _optimizer2 = accelerator.prepare(model, optimizer, device_placement=[False, True])
    assert model2 is model


def test_backward_divides_by_accumulation_steps() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.ones(3, 4)
    accelerator.backward(model(x).sum())
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    reference(x).sum().backward()
    assert torch.allclose(model.weight.grad * 4, reference.weight.grad)


def test_accumulate_syncs_every_n_steps_and_optimizer_waits() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    pattern, changed = [], []
    for _ in range(6):
        before = model.weight.detach().clone()
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 4)).sum())
            pattern.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
        changed.append(not torch.equal(before, model.weight))
    assert pattern == [False, False, True, False, False, True]
    assert changed == pattern


def test_accumulated_gradients_equal_full_batch() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer = _model_and_optimizer()
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.randn(8, 4)
    for chunk in data.split(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(chunk).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    for chunk in data.split(4):
        reference(chunk).pow(2).mean().backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    assert torch.allclose(model.weight, reference.weight, atol=1e-6)


def test_gradient_accumulation_plugin_and_steps_conflict() -> None:
    with pytest.raises(
        ValueError, match="You can only pass one of `GradientAccumulationPlugin` and `gradient_accumulation_steps`"
    ):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )


def test_scheduler_follows_optimizer_steps() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(4):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 4)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.get_last_lr() == [pytest.approx(0.1 * 0.5**2)]


def test_scheduler_not_stepped_with_optimizer() -> None:
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False, gradient_accumulation_steps=2)
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _, _, scheduler = accelerator.prepare(model, optimizer, scheduler)
    scheduler.step()
    assert scheduler.get_last_lr() == [pytest.approx(0.05)]


def test_zero_grad_is_noop_on_accumulation_steps() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 4)).sum())
        optimizer.zero_grad()
    assert model.weight.grad is not None


def test_bf16_autocast_forward_returns_fp32() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    seen = {}
    model[0].register_forward_hook(lambda module, inputs, output: seen.__setitem__("dtype", output.dtype))
    model = accelerator.prepare(model)
    out = model(torch.randn(2, 4))
    assert seen["dtype"] == torch.bfloat16 and out.dtype == torch.float32
    with accelerator.autocast():
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16
    with accelerator.autocast(AutocastKwargs(enabled=False)):
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.randn(2, 4)).dtype == torch.float32 and seen["dtype"] == torch.float32
    assert "forward" not in plain.__dict__


def test_autocast_is_null_without_mixed_precision() -> None:
    accelerator = Accelerator(cpu=True)
    with accelerator.autocast():
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32


def test_fp16_scaler_skips_step_on_overflow() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024)])
    assert accelerator.scaler is not None and accelerator.scaler.get_scale() == 1024
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.full((1, 4), float("inf"))).sum())
    optimizer.step()
    scheduler.step()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert torch.equal(before, model.weight)
    assert scheduler.get_last_lr() == [pytest.approx(0.1)]  # no scheduler step on a skipped update
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(1, 4)).sum())
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped and not torch.equal(before, model.weight)


def test_clip_grad_norm_unscales_fp16_gradients() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256)])
    model, optimizer = _model_and_optimizer()
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.ones(2, 4)
    accelerator.backward(model(x).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
    reference(x).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    assert torch.allclose(norm, expected, rtol=1e-2)


def test_clip_grad_value() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.full((2, 4), 10.0)).sum())
    accelerator.clip_grad_value_(model.parameters(), 0.5)
    assert model.weight.grad.abs().max() <= 0.5


def test_kwargs_handlers_one_of_each_kind() -> None:
    with pytest.raises(ValueError, match="only pass one AutocastKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[AutocastKwargs(), AutocastKwargs()])
    with pytest.raises(TypeError, match="KwargsHandler"):
        Accelerator(cpu=True, kwargs_handlers=[{"enabled": True}])  # type: ignore[list-item]


def test_wrong_mixed_precision_is_named() -> None:
    with pytest.raises(ValueError, match="'fp32' is not a valid PrecisionType"):
        Accelerator(cpu=True, mixed_precision="fp32")


def test_fp8_without_any_backend_names_the_packages(monkeypatch) -> None:
    from accel_quant import _requirements

    for name in ("is_torchao_available", "is_transformer_engine_available", "is_msamp_available"):
        monkeypatch.setattr(_requirements, name, lambda: False)
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND", raising=False)
    with pytest.raises(ImportError, match=r"no(ne)? .*installed.*accel-quant\[torchao\]"):
        Accelerator(cpu=True, mixed_precision="fp8")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"megatron_lm_plugin": MegatronLMPlugin(tp_degree=1)}, "Megatron-LM"),
    ],
)
def test_later_backends_are_accepted_then_refused_at_prepare(kwargs: dict, name: str) -> None:
    # Megatron-LM's layers need CUDA (and megatron-core): on this CPU machine prepare names what is missing.
    accelerator = Accelerator(cpu=True, **kwargs)
    with pytest.raises(BackendNotAvailableError, match=f"{name} (training )?needs (CUDA|megatron-core)"):
        accelerator.prepare(torch.nn.Linear(2, 2))


def test_unwrap_compiled_model_and_get_state_dict() -> None:
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    assert type(model).__name__ == "OptimizedModule"
    assert model(torch.ones(1, 4)).shape == (1, 2)
    assert isinstance(accelerator.unwrap_model(model, keep_torch_compile=False), torch.nn.Linear)
    assert type(accelerator.unwrap_model(model)).__name__ == "OptimizedModule"
    assert set(accelerator.get_state_dict(model)) == {"weight", "bias"}


def test_evaluation_mode_applies_precision_only() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare_model(torch.nn.Linear(4, 2), evaluation_mode=True)
    assert isinstance(model, torch.nn.Linear) and model(torch.ones(1, 4)).dtype == torch.float32


def test_trigger_single_process() -> None:
    accelerator = Accelerator(cpu=True)
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger()
    assert not accelerator.check_trigger()


def test_process_helpers_single_process(capsys: pytest.CaptureFixture[str]) -> None:
    accelerator = Accelerator(cpu=True)
    calls = []
    accelerator.on_main_process(lambda: calls.append("main"))()
    accelerator.on_process(lambda: calls.append("p1"), process_index=1)()
    accelerator.on_last_process(lambda: calls.append("last"))()
    assert calls == ["main", "last"]
    with pytest.raises(ValueError, match="process_index"):
        accelerator.on_process(lambda: None)
    with accelerator.split_between_processes(["a", "b", "c"]) as share:
        assert share == ["a", "b", "c"]
    with accelerator.main_process_first():
        accelerator.print("hello")
    assert capsys.readouterr().out == "hello\n"
    tensor = torch.arange(3)
    assert torch.equal(accelerator.gather(tensor), tensor)
    assert torch.equal(accelerator.reduce(tensor), tensor)
    assert torch.equal(accelerator.pad_across_processes(tensor), tensor)
    assert accelerator.gather_for_metrics(["x", "y"]) == ["x", "y"]


def test_free_memory_drops_references() -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _model_and_optimizer()
    accelerator.prepare(model, optimizer)
    accelerator.step = 5
    assert accelerator.free_memory(model, optimizer) == [None, None]
    assert accelerator._models == [] and accelerator._optimizers == [] and accelerator.step == 0
    assert accelerator.clear == accelerator.free_memory


def test_save_is_atomic_and_safetensors_optional(tmp_path) -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.save({"a": torch.ones(2)}, tmp_path / "obj.pt")
    assert torch.equal(torch.load(tmp_path / "obj.pt", weights_only=True)["a"], torch.ones(2))
    accelerator.save({"a": torch.zeros(2)}, tmp_path / "obj.safetensors", safe_serialization=True)
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "obj.safetensors")["a"], torch.zeros(2))
    assert sorted(os.listdir(tmp_path)) == ["obj.pt", "obj.safetensors"]


def test_save_model_writes_sharded_safetensors_with_index(tmp_path) -> None:
    pytest.importorskip("accel_bigmodel.sharding")
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(TinyNet(width=64))
    accelerator.save_model(model, tmp_path, max_shard_size="1KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    from safetensors.torch import load_file

    merged = {}
    for shard in set(index["weight_map"].values()):
        merged.update(load_file(tmp_path / shard))
    assert all(torch.equal(merged[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="is a file"):
        accelerator.save_model(model, tmp_path / "model.safetensors.index.json")


def test_profile_writes_chrome_trace(tmp_path) -> None:
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path))]
    )
    model = accelerator.prepare(torch.nn.Linear(8, 8))
    with accelerator.profile() as profiler:
        model(torch.randn(4, 8))
    assert any("addmm" in event.key or "linear" in event.key for event in profiler.key_averages())
    trace = json.loads((tmp_path / "profile_0.json").read_text())
    assert "traceEvents" in trace


def test_verify_device_map() -> None:
    accelerator = Accelerator(cpu=True)
    model = TinyNet()
    assert not accelerator.verify_device_map(model)
    model.hf_device_map = {"fc1": "cpu", "fc2": "disk"}
    assert accelerator.verify_device_map(model)


def test_lomo_backward_needs_lomo() -> None:
    accelerator = Accelerator(cpu=True)
    from accel_state.imports import is_lomo_available

    if is_lomo_available():
        pytest.skip("lomo-optim is installed; this checks the error when it is not")
    with pytest.raises(ImportError, match="pip install lomo-optim"):
        accelerator.lomo_backward(torch.tensor(1.0), 0.1)


def test_training_loop_with_data_loader_matches_plain_pytorch() -> None:
    dataset = regression_dataset()
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5)  # 10 batches: the last one syncs early
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    syncs = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    assert syncs == [False, False, True] * 3 + [True]
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    x_all, y_all = dataset.tensors
    batches = list(zip(x_all.split(5), y_all.split(5)))
    for start in range(0, len(batches), 3):
        for x, y in batches[start : start + 3]:
            (torch.nn.functional.mse_loss(reference(x), y) / 3).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    assert torch.allclose(flat_params(model), flat_params(reference), atol=1e-6)


def test_skip_first_batches() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(10)), batch_size=2))
    skipped = accelerator.skip_first_batches(loader, num_batches=3)
    assert [batch.tolist() for batch in skipped] == [[6, 7], [8, 9]]
    assert len(list(loader)) == 5


def test_gradient_accumulation_steps_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    accelerator = Accelerator(cpu=True)
    assert accelerator.gradient_accumulation_steps == 4
    accelerator.gradient_accumulation_steps = 2
    assert accelerator.gradient_state.num_steps == 2
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1"):
        accelerator.gradient_accumulation_steps = 0


def test_mixed_precision_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert Accelerator(cpu=True).mixed_precision == "bf16"


def test_split_batches_default_reads_as_what_it_does_and_keeps_the_loader_config() -> None:
    import inspect

    from accel_data.config import DataLoaderConfiguration

    default = inspect.signature(Accelerator).parameters["split_batches"].default
    assert repr(default) == "FROM_DATALOADER_CONFIG"  # what help() and the API reference show, not `_UNSET`
    assert Accelerator(cpu=True).split_batches is False
    kept = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert kept.split_batches is True
    overridden = Accelerator(
        cpu=True, split_batches=False, dataloader_config=DataLoaderConfiguration(split_batches=True)
    )
    assert overridden.split_batches is False

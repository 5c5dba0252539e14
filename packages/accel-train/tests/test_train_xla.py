"""XLA / TPU without torch_xla (the normal test run; the real runs are in ``test_xla_device.py``, under
``nox -s xla``): the named error without it, and what the strategy asks of the device layer (gradient
reduction once per optimizer step, a graph cut after each step, the device loader, a graph cut before a
checkpoint is read), checked against a small fake of ``torch_xla.core.xla_model``."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import pytest
import torch

from accel_train import Accelerator
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.strategies import strategy_class
from accel_train.strategies.xla.strategy import XLADeviceLoader, XLAOptimizer, XLAStrategy, torch_xla_available


def _strategy(accelerator: Accelerator) -> XLAStrategy:
    return XLAStrategy(accelerator.state, accelerator._strategy.precision)


@pytest.mark.skipif(torch_xla_available(), reason="checks the error given without torch_xla")
def test_without_torch_xla_prepare_names_what_is_missing() -> None:
    assert strategy_class("xla") is XLAStrategy
    strategy = _strategy(Accelerator(cpu=True))
    with pytest.raises(BackendNotAvailableError, match="XLA / TPU training needs torch_xla.*accel-train\\[xla\\]"):
        strategy.setup([torch.nn.Linear(2, 2)], [], [], [True])
    assert strategy.setup([], [], [], []).models == []  # nothing to place: nothing asked of torch_xla


class _FakeXLA:
    """Records what the strategy asks of ``xla_model`` (one process: reducing gradients leaves them as they are)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        assert isinstance(optimizer, torch.optim.Optimizer)
        self.calls.append("reduce_gradients")

    def mark_step(self) -> None:
        self.calls.append("mark_step")


@pytest.fixture
def fake_xla(monkeypatch: pytest.MonkeyPatch) -> _FakeXLA:
    fake = _FakeXLA()
    modules = {
        "torch_xla": types.ModuleType("torch_xla"),
        "torch_xla.core": types.ModuleType("torch_xla.core"),
        "torch_xla.core.xla_model": types.ModuleType("torch_xla.core.xla_model"),
    }
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    modules["torch_xla.core.xla_model"].reduce_gradients = fake.reduce_gradients  # type: ignore[attr-defined]
    modules["torch_xla.core.xla_model"].mark_step = fake.mark_step  # type: ignore[attr-defined]
    return fake


def test_gradients_are_reduced_once_per_optimizer_step(fake_xla: _FakeXLA) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    strategy = _strategy(accelerator)
    model = torch.nn.Linear(2, 1)
    prepared = strategy.setup([model], [torch.optim.SGD(model.parameters(), lr=0.1)], [], [True])
    optimizer = strategy.wrap_optimizer(prepared.optimizers[0], True)
    assert isinstance(optimizer, XLAOptimizer)
    x = torch.ones(4, 2)
    for _ in range(2):  # one accumulation step, then the sync step
        with accelerator.accumulate(prepared.models[0]):
            strategy.backward(prepared.models[0](x).sum(), 2)
            optimizer.step()
            optimizer.zero_grad()
    assert fake_xla.calls == ["reduce_gradients", "mark_step"]  # the step's graph runs right after it
    with accelerator.accumulate(prepared.models[0]):
        pass
    fake_xla.calls.clear()
    prepared.models[0](x).sum().backward()
    accelerator.gradient_state._set_sync_gradients(True)
    strategy.clip_grad_norm_(model.parameters(), 1.0, 2.0, [optimizer])
    optimizer.step()  # clipping reduced the gradients already
    assert fake_xla.calls == ["reduce_gradients", "mark_step"]
    assert not accelerator.gradient_state.is_xla_gradients_synced


def test_loaders_go_through_the_device_loader_and_checkpoints_cut_the_graph(fake_xla: _FakeXLA) -> None:
    accelerator = Accelerator(cpu=True)
    strategy = _strategy(accelerator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4.0)), batch_size=2)
    wrapped = strategy.setup_data_loader(loader, put_on_device=False)
    assert isinstance(wrapped, XLADeviceLoader) and wrapped.device == strategy.device
    assert wrapped.dataset is loader.dataset and len(wrapped) == 2  # the sharded loader's own attributes
    assert [batch[0].tolist() for batch in wrapped] == [[0.0, 1.0], [2.0, 3.0]]
    assert fake_xla.calls == ["mark_step", "mark_step"]  # one graph cut before each batch
    fake_xla.calls.clear()
    assert not isinstance(strategy.skip_first_batches(loader, 1), XLADeviceLoader)  # a plain loader stays plain
    skipped = strategy.skip_first_batches(wrapped, 1)
    assert isinstance(skipped, XLADeviceLoader) and [batch[0].tolist() for batch in skipped] == [[2.0, 3.0]]
    fake_xla.calls.clear()
    model = torch.nn.Linear(2, 1)
    weights = strategy.checkpoint_weights(model)
    assert fake_xla.calls == ["mark_step"]
    assert set(weights) == {"weight", "bias"} and all(v.device.type == "cpu" for v in weights.values())


def test_bf16_on_a_tpu_sets_torch_xla_variables_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_state import imports

    # set through monkeypatch, so that what apply_settings writes is undone after the test (a leaked
    # XLA_USE_BF16=1 would make every later torch_xla process of the session compute in bf16)
    for name in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        monkeypatch.setenv(name, "unset")
    monkeypatch.delenv("ACCELERATE_DOWNCAST_BF16", raising=False)
    monkeypatch.setattr(imports, "is_torch_xla_available", lambda check_is_tpu=False, check_is_gpu=False: False)
    XLAStrategy.apply_settings(None, "bf16", None)  # torch_xla's CPU device: autocast only
    assert os.environ["XLA_USE_BF16"] == "unset"
    monkeypatch.setattr(imports, "is_torch_xla_available", lambda check_is_tpu=False, check_is_gpu=False: True)
    XLAStrategy.apply_settings(None, "no", None)
    assert os.environ["XLA_USE_BF16"] == "unset"
    XLAStrategy.apply_settings(None, "bf16", None)
    assert (os.environ["XLA_USE_BF16"], os.environ["XLA_DOWNCAST_BF16"]) == ("1", "0")
    monkeypatch.setenv("ACCELERATE_DOWNCAST_BF16", "true")
    XLAStrategy.apply_settings(None, "bf16", None)
    assert (os.environ["XLA_USE_BF16"], os.environ["XLA_DOWNCAST_BF16"]) == ("0", "1")


@pytest.mark.parametrize("seed", ["-1", "abc", str(2**64), "1e3"])
def test_a_damaged_torch_xla_seed_is_refused_before_anything_loads(tmp_path, seed: str) -> None:
    from accel_state.errors import CorruptCheckpointError
    from accel_train.checkpoint.file_io import XLA_RNG_KEY, load_rng, rng_states, save_rng

    tensors, metadata = rng_states()
    path = str(tmp_path / "random_states_0.safetensors")
    save_rng(path, states=(tensors, {**metadata, XLA_RNG_KEY: seed}))
    before = torch.get_rng_state()
    torch.rand(3)
    changed = torch.get_rng_state()
    with pytest.raises(CorruptCheckpointError, match="xla_manual_seed"):
        load_rng(path)
    assert torch.equal(torch.get_rng_state(), changed) and not torch.equal(before, changed)


def test_a_torch_xla_seed_is_skipped_by_a_run_not_on_xla(tmp_path) -> None:
    from accel_train.checkpoint.file_io import XLA_RNG_KEY, load_rng, rng_states, save_rng

    tensors, metadata = rng_states()
    assert XLA_RNG_KEY not in metadata  # not on XLA: nothing of torch_xla saved
    path = str(tmp_path / "random_states_0.safetensors")
    save_rng(path, states=(tensors, {**metadata, XLA_RNG_KEY: str(2**64 - 1)}))
    load_rng(path)  # the CPU generators come back; torch_xla's seed has no generator here
    assert torch.equal(torch.get_rng_state(), tensors["torch_manual_seed"])

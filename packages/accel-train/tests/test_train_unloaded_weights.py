"""``prepare`` of a model whose weights were never loaded: one clear error before anything moves; models
whose ``meta`` weights an offload hook holds (cpu/disk offload, dispatched) are prepared (issue 37)."""

from __future__ import annotations

import pickle

import pytest
import torch
from train_helpers import regression_dataset

from accel_bigmodel import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accel_train import Accelerator, UnloadedWeightsError


def _net() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _empty() -> torch.nn.Sequential:
    with init_empty_weights():
        return _net()


def test_an_empty_model_is_refused_by_name_before_anything_is_prepared() -> None:
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(regression_dataset(8), batch_size=4)
    with pytest.raises(UnloadedWeightsError) as raised:
        accelerator.prepare(loader, _empty())
    error = raised.value
    assert isinstance(error, ValueError) and isinstance(error, NotImplementedError)
    text = str(error)
    assert "4 of the 4 parameters and buffers of Sequential are on the meta device" in text
    assert "'0.weight', '0.bias', '2.weight', '2.bias'" in text and "never loaded" in text
    for remedy in ("load_checkpoint_and_dispatch", "load_checkpoint_in_model", "model.to_empty(device=...)"):
        assert remedy in text
    assert error.names == ["0.weight", "0.bias", "2.weight", "2.bias"] and error.total == 4
    assert accelerator._models == [] and accelerator._dataloaders == []  # nothing prepared or registered


def test_only_the_weights_left_on_meta_are_named_and_long_lists_are_cut() -> None:
    model = _net()
    with init_empty_weights():
        model[2] = torch.nn.Linear(8, 2)
    with pytest.raises(UnloadedWeightsError, match=r"2 of the 4 .*\('2\.weight', '2\.bias'\)\. A model"):
        Accelerator(cpu=True).prepare(model)
    with init_empty_weights():
        deep = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)])
    with pytest.raises(UnloadedWeightsError, match=r"'2\.weight' and 3 more\)"):
        Accelerator(cpu=True).prepare(deep)


def test_prepare_model_and_evaluation_mode_refuse_it_too() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(UnloadedWeightsError):
        accelerator.prepare_model(_empty())
    with pytest.raises(UnloadedWeightsError):
        accelerator.prepare_model(_empty(), evaluation_mode=True)
    with pytest.raises(UnloadedWeightsError):  # not moved, but its weights are nowhere all the same
        accelerator.prepare(_empty(), device_placement=[False])


def test_a_device_map_without_hooks_does_not_hide_missing_weights() -> None:
    model = _empty()
    model.hf_device_map = {"0": "cpu", "2": "disk"}  # claims a dispatch, but no hook holds anything
    with pytest.raises(UnloadedWeightsError, match="4 of the 4"):
        Accelerator(cpu=True).prepare(model)


def test_the_error_survives_pickling_between_processes() -> None:
    error = pickle.loads(pickle.dumps(UnloadedWeightsError("Net", ["a.weight"], 3)))
    assert isinstance(error, UnloadedWeightsError) and error.names == ["a.weight"] and "1 of the 3" in str(error)


def test_materialised_with_to_empty_then_initialised_is_accepted() -> None:
    model = _empty()
    model.to_empty(device="cpu")
    for layer in (model[0], model[2]):
        layer.reset_parameters()
    prepared = Accelerator(cpu=True).prepare(model)
    assert prepared(torch.ones(1, 4)).shape == (1, 2)


@pytest.mark.parametrize("how", ["cpu_offload", "disk_offload", "dispatch cpu+disk", "checkpoint cpu+disk"])
def test_models_whose_hooks_hold_the_weights_are_prepared_and_compute_the_same(tmp_path, how: str) -> None:
    torch.manual_seed(0)
    original = _net()
    x = torch.randn(3, 4)
    expected = original(x).detach()
    if how == "cpu_offload":
        model = cpu_offload(original, execution_device=torch.device("cpu"))
    elif how == "disk_offload":
        model = disk_offload(original, str(tmp_path / "off"), execution_device=torch.device("cpu"))
    elif how == "dispatch cpu+disk":
        model = dispatch_model(original, {"0": "cpu", "1": "cpu", "2": "disk"}, offload_dir=str(tmp_path / "off"))
    else:
        Accelerator(cpu=True).save_model(original, str(tmp_path / "ckpt"))
        model = load_checkpoint_and_dispatch(
            _empty(), str(tmp_path / "ckpt"), device_map={"0": "cpu", "1": "cpu", "2": "disk"},
            offload_folder=str(tmp_path / "off"),
        )  # fmt: skip
    assert any(p.device.type == "meta" for p in model.parameters())  # held by the hooks, not by the model
    prepared = Accelerator(cpu=True).prepare(model)
    assert torch.allclose(prepared(x), expected)


def test_a_backend_that_fills_meta_weights_itself_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = Accelerator(cpu=True)
    strategy = type(accelerator._strategy)
    monkeypatch.setattr(strategy, "materialises_meta_weights", lambda self, evaluation_mode=False: True)
    model = _empty()
    assert accelerator.prepare(model) is model  # left on meta for the backend: not moved, no torch error

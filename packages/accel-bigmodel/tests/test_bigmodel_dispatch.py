"""Hooks, dispatch and offload: outputs equal the in-memory model; weights come back to meta after each forward."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from bigmodel_models import Mlp, Net, make_net
from torch import nn

from accel_bigmodel.alignment import align_module_device, has_offloaded_params
from accel_bigmodel.big_modeling import (
    attach_layerwise_casting_hooks,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
)
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from accel_bigmodel.modeling import (
    get_module_children_bottom_up,
    get_state_dict_offloaded_model,
    set_module_tensor_to_device,
)
from accel_bigmodel.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from accel_bigmodel.prefetch import WeightPrefetcher

IDS = torch.randint(0, 32, (3, 5), generator=torch.Generator().manual_seed(1))


class AddOne(ModelHook):
    def pre_forward(self, module: nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
        return (args[0] + 1,), kwargs


class Double(ModelHook):
    def post_forward(self, module: nn.Module, output):  # type: ignore[no-untyped-def]
        return output * 2


def test_add_and_remove_hooks_restore_forward() -> None:
    layer = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    expected = layer(x)
    add_hook_to_module(layer, AddOne())
    assert torch.allclose(layer(x), layer._old_forward(x + 1))
    add_hook_to_module(layer, Double(), append=True)
    assert isinstance(layer._hf_hook, SequentialHook)
    assert torch.allclose(layer(x), 2 * layer._old_forward(x + 1))
    remove_hook_from_module(layer)
    assert not hasattr(layer, "_hf_hook") and "forward" not in layer.__dict__
    assert torch.allclose(layer(x), expected)


def test_remove_hook_from_submodules() -> None:
    model = Mlp()
    for sub in model.modules():
        add_hook_to_module(sub, ModelHook())
    remove_hook_from_submodules(model)
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())


def test_cpu_offload_matches_and_keeps_meta_between_forwards() -> None:
    reference = make_net().eval()
    model = make_net().eval()
    cpu_offload(model, execution_device="cpu")
    assert model.blocks[0].a.weight.device.type == "meta"
    assert has_offloaded_params(model.blocks[0].a) and not has_offloaded_params(model.blocks)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(IDS), reference(IDS))
    assert model.blocks[0].a.weight.device.type == "meta"


def test_disk_offload_matches(tmp_path: Path) -> None:
    reference = make_net().eval()
    model = make_net().eval()
    disk_offload(model, tmp_path / "off", execution_device="cpu")
    assert (tmp_path / "off" / "index.json").is_file()
    with torch.no_grad():
        assert torch.equal(model(IDS), reference(IDS))
        assert torch.equal(model(IDS[:1]), reference(IDS[:1]))


def test_preload_module_classes_loads_whole_blocks(tmp_path: Path) -> None:
    reference = make_net().eval()
    model = make_net().eval()
    disk_offload(model, tmp_path / "off", execution_device="cpu", preload_module_classes=["Block"])
    assert has_offloaded_params(model.blocks[0]) and not hasattr(model.blocks[0].a, "_hf_hook")
    with torch.no_grad():
        assert torch.equal(model(IDS), reference(IDS))


def test_dispatch_cpu_and_disk(tmp_path: Path) -> None:
    reference = make_net().eval()
    model = make_net().eval()
    device_map = {
        "embed": "cpu",
        "blocks.0": "cpu",
        "blocks.1": "disk",
        "blocks.2": "cpu",
        "blocks.3": "disk",
        "head": "disk",
        "scale": "cpu",
    }
    dispatch_model(model, device_map, offload_dir=tmp_path / "off")
    assert model.hf_device_map == device_map
    with torch.no_grad():
        assert torch.equal(model(IDS), reference(IDS))
    with pytest.warns(UserWarning, match="dispatched"):
        assert model.to("cpu") is model


def test_dispatch_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(make_net(), {"embed": "cpu", "blocks": "disk", "head": "cpu", "scale": "cpu"})
    with pytest.raises(ValueError, match="disk_offload"):
        dispatch_model(make_net(), {"": "disk"})
    with pytest.raises(ValueError, match="blocks.9"):
        dispatch_model(make_net(), {"": "cpu", "blocks.9": "cpu"})


def test_single_device_map_moves_without_hooks() -> None:
    model = dispatch_model(make_net(), {"": "cpu"})
    assert not hasattr(model, "_hf_hook") and model.hf_device_map == {"": "cpu"}
    model = dispatch_model(make_net(), {"": "cpu"}, force_hooks=True)
    assert hasattr(model, "_hf_hook")


def test_cpu_offload_with_hook_chain() -> None:
    first, second = Mlp(), Mlp()
    first, hook1 = cpu_offload_with_hook(first, "cpu")
    second, hook2 = cpu_offload_with_hook(second, "cpu", prev_module_hook=hook1)
    calls = []
    original = hook1.offload
    hook1.offload = lambda: (calls.append("offload1"), original())[1]  # type: ignore[method-assign]
    x = torch.randn(2, 8)
    out = second(first(x))
    assert out.shape == (2, 8) and calls == ["offload1"]
    hook2.remove()
    assert not hasattr(second, "_hf_hook")


def test_align_devices_hook_io_same_device_and_skip_keys() -> None:
    layer = nn.Linear(2, 2)
    hook = AlignDevicesHook(execution_device="cpu", io_same_device=True, skip_keys="cache")
    add_hook_to_module(layer, hook)
    assert layer(torch.randn(1, 2)).device.type == "cpu"


def test_attach_execution_device_hook_marks_modules_with_weights() -> None:
    model = Mlp()
    attach_execution_device_hook(model, "cpu")
    assert all(hasattr(m, "_hf_hook") for m in model.modules())


def test_align_module_device_reads_offloaded_weights() -> None:
    model = make_net()
    expected = model.head.weight.detach().clone()
    cpu_offload(model, execution_device="cpu")
    with align_module_device(model.head):
        assert torch.equal(model.head.weight, expected)
    assert model.head.weight.device.type == "meta"
    state = get_state_dict_offloaded_model(model)
    assert torch.equal(state["head.weight"], expected)


def test_layerwise_casting_hooks() -> None:
    model = Mlp().eval()
    x = torch.randn(2, 8)
    attach_layerwise_casting_hooks(
        model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32, skip_modules_pattern=r"layers\.0$"
    )
    assert model.layers[1].weight.dtype == torch.bfloat16 and model.layers[0].weight.dtype == torch.float32
    assert model(x).dtype == torch.float32
    assert model.layers[1].weight.dtype == torch.bfloat16


def test_set_module_tensor_to_device_checks() -> None:
    with init_empty_weights():
        model = Net()
    with pytest.raises(ValueError, match="meta"):
        set_module_tensor_to_device(model, "head.weight", "cpu")
    with pytest.raises(ValueError, match="shape"):
        set_module_tensor_to_device(model, "head.weight", "cpu", value=torch.zeros(3))
    with pytest.raises(ValueError, match="nothing"):
        set_module_tensor_to_device(model, "head.nothing", "cpu", value=torch.zeros(3))
    set_module_tensor_to_device(model, "head.weight", "cpu", value=torch.ones(32, 16, dtype=torch.float64))
    assert model.head.weight.dtype == torch.float32 and isinstance(model.head.weight, nn.Parameter)
    set_module_tensor_to_device(model, "scale", "cpu", value=torch.zeros(16), dtype=torch.float16)
    assert model.scale.dtype == torch.float16


def test_offload_state_dict_and_loader(tmp_path: Path) -> None:
    sd = {"a.weight": torch.randn(3, 3), "b.weight": torch.randn(2).to(torch.bfloat16), "c": torch.tensor(3)}
    offload_state_dict(tmp_path, sd)
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["b.weight"]["dtype"] == "bfloat16" and index["b.weight"]["safetensors_file"].endswith(".safetensors")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) == 1  # one file, not one per tensor
    loader = OffloadedWeightsLoader(state_dict={"ram": torch.ones(1)}, save_folder=tmp_path)
    assert set(loader) == {"ram", "a.weight", "b.weight", "c"}
    for key, value in sd.items():
        assert torch.equal(loader[key], value)
    prefixed = PrefixedDataset(loader, "a.")
    assert torch.equal(prefixed["weight"], sd["a.weight"]) and list(prefixed) == ["weight"]
    assert extract_submodules_state_dict(sd, ["a"]) == {"a.weight": sd["a.weight"]}
    with pytest.raises(ValueError, match="needs"):
        OffloadedWeightsLoader()


def test_load_offloaded_weights_and_truncated_dat(tmp_path: Path) -> None:
    reference = make_net()
    index = offload_weight(reference.head.weight.detach(), "head.weight", tmp_path)
    save_offload_index(index, tmp_path)
    assert index == {"head.weight": {"dtype": "float32", "shape": [32, 16]}}
    with init_empty_weights():
        model = Net()
    load_offloaded_weights(model, index, tmp_path)
    assert torch.equal(model.head.weight, reference.head.weight)
    with open(tmp_path / "head.weight.dat", "r+b") as f:
        f.truncate(10)
    from accel_bigmodel.tensor_io import CheckpointError

    with pytest.raises(CheckpointError, match="head.weight.dat"):
        load_offloaded_weights(model, index, tmp_path)


def test_prefetcher_out_of_order_and_repeated_calls(tmp_path: Path) -> None:
    reference = Mlp(depth=6).eval()
    model = Mlp(depth=6).eval()
    model.load_state_dict(reference.state_dict())
    disk_offload(model, tmp_path / "off", execution_device="cpu")
    prefetcher = model._accel_prefetcher
    assert isinstance(prefetcher, WeightPrefetcher) and len(prefetcher.hooks) == 6
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
        # out of order and repeated calls read directly and stay correct
        layers = model.layers
        assert torch.equal(layers[3](x), reference.layers[3](x))
        assert torch.equal(layers[3](x), reference.layers[3](x))
        assert torch.equal(layers[0](layers[5](x)), reference.layers[0](reference.layers[5](x)))
        assert torch.equal(model(x), reference(x))


def test_prefetcher_chunks_small_layers_together(tmp_path: Path) -> None:
    model = Mlp(depth=8)
    disk_offload(model, tmp_path / "off", execution_device="cpu")
    prefetcher = model._accel_prefetcher
    assert len(prefetcher.chunk_slots) == 1  # tiny layers share one read-ahead chunk
    big = WeightPrefetcher(chunk_bytes=1)
    for hook in prefetcher.hooks:
        big.register(hook, 100)
    assert len(big.chunk_slots) == 8


def test_module_order_helpers() -> None:
    model = Mlp(depth=2)
    names = [n for n, _ in get_module_children_bottom_up(model, return_fqns=True)]
    assert names == ["layers.0", "layers.1", "layers", ""]


def test_attach_align_device_hook_with_weights_map() -> None:
    reference = Mlp().eval()
    model = Mlp().eval()
    model.load_state_dict(reference.state_dict())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights)
    assert model.layers[0].weight.device.type == "meta"
    x = torch.randn(2, 8)
    assert torch.equal(model(x), reference(x))
    remove_hook_from_submodules(model)
    assert model.layers[0].weight.device.type == "cpu"
    assert torch.equal(model(x), reference(x))


def test_weights_map_missing_file_is_clear(tmp_path: Path) -> None:
    model = make_net()
    disk_offload(model, tmp_path / "off", execution_device="cpu")
    (stored,) = (tmp_path / "off").glob("*.safetensors")
    os.remove(stored)
    with pytest.raises(FileNotFoundError, match=stored.name):
        model(IDS)


def test_coalesced_reads_match_single_reads(tmp_path: Path) -> None:
    from accel_bigmodel.tensor_io import FileHandles, read_coalesced, read_safetensors_header

    torch.manual_seed(0)
    sd = {"a": torch.randn(5), "b": torch.randn(3).half(), "c": torch.arange(7), "d": torch.randn(2, 2)}
    from safetensors.torch import save_file

    save_file(sd, tmp_path / "x.safetensors")
    locations, _ = read_safetensors_header(str(tmp_path / "x.safetensors"))
    names = ["d", "a", "c", "b"]
    tensors = read_coalesced([locations[n] for n in names], FileHandles())
    for name, tensor in zip(names, tensors):
        assert torch.equal(tensor, sd[name])


def test_offload_buffers_moves_buffers_too(tmp_path: Path) -> None:
    reference = make_net().eval()
    model = make_net().eval()
    disk_offload(model, tmp_path / "off", execution_device="cpu", offload_buffers=True)
    assert model.scale.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(IDS), reference(IDS))
    kept = make_net().eval()
    disk_offload(kept, tmp_path / "off2", execution_device="cpu")
    assert kept.scale.device.type == "cpu"

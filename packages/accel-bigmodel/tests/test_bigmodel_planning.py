"""Sizes and device-map planning: pure logic, in-process, on meta models."""

from __future__ import annotations

import pytest
import torch
from bigmodel_models import Block, Net
from torch import nn

from accel_bigmodel.empty import init_empty_weights, init_on_device
from accel_bigmodel.planning import check_device_map, clean_device_map, get_balanced_memory, infer_auto_device_map
from accel_bigmodel.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    dtype_byte_size,
    get_max_layer_size,
    parse_size,
)
from accel_bigmodel.tied import find_tied_parameters, retie_parameters


def meta_net(**kwargs: object) -> Net:
    with init_empty_weights():
        return Net(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (10, 10),
        ("10GB", 10**10),
        ("10GiB", 10 * 2**30),
        ("1.5KB", 1500),
        ("3 MiB", 3 * 2**20),
        ("7", 7),
        ("2kib", 2048),
    ],
)
def test_parse_size(text: object, value: int) -> None:
    assert parse_size(text) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["10 parsecs", "GB", "", "-3GB", "1e3GB"])
def test_parse_size_rejects_bad_strings_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        parse_size(bad)


def test_parse_size_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        parse_size([3])  # type: ignore[arg-type]


def test_init_empty_weights_puts_parameters_on_meta_and_keeps_buffers() -> None:
    model = meta_net()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.scale.device.type == "cpu"
    with init_empty_weights(include_buffers=True):
        model = Net()
    assert model.scale.device.type == "meta"
    # outside the context, modules are created normally again
    assert Block().a.weight.device.type == "cpu"


def test_init_on_device_cpu() -> None:
    with init_on_device("cpu"):
        model = Net()
    assert model.embed.weight.device.type == "cpu"


def test_module_sizes_and_largest_layer() -> None:
    model = meta_net(blocks=2, width=16)
    sizes = compute_module_sizes(model)
    linear = (16 * 16 + 16) * 4
    assert sizes["blocks.0.a"] == linear
    assert sizes["blocks.0"] == 2 * linear + 2 * 16 * 4
    assert sizes[""] == sum(p.numel() * 4 for p in model.parameters()) + 16 * 4
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half["blocks.0.a"] == linear // 2
    special = compute_module_sizes(model, dtype=torch.float16, special_dtypes={"blocks.0.a.weight": torch.float32})
    assert special["blocks.0.a"] == 16 * 16 * 4 + 16 * 2
    size, names = get_max_layer_size(list(model.named_children()), sizes, ["Block"])
    assert size == sizes["blocks.0"] and names == ["blocks.0", "blocks.1"]
    total, (largest, _) = calculate_maximum_sizes(model)
    assert total == sizes[""] and largest == sizes["embed"]
    assert dtype_byte_size(torch.bool) == 1 / 8 and dtype_byte_size("int4") == 0.5


def test_sequential_fill_cpu_then_disk() -> None:
    model = meta_net(blocks=4)
    sizes = compute_module_sizes(model)
    budget = sizes["embed"] + sizes["blocks.0"] + sizes["blocks.0"]  # room for embed, one block, and the reserve
    device_map = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    assert device_map["embed"] == "cpu" and device_map["blocks.0"] == "cpu"
    assert device_map["blocks.1"] == "disk" and device_map["head"] == "disk"
    check_device_map(model, device_map)


def test_splits_blocks_only_when_allowed() -> None:
    model = meta_net(blocks=2)
    sizes = compute_module_sizes(model)
    budget = sizes["embed"] + sizes["blocks.0.a"] * 2 + sizes["blocks.0.a"]
    split = infer_auto_device_map(model, max_memory={"cpu": budget})
    assert any(key.startswith("blocks.0.") for key in split)
    whole = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    assert not any(key.startswith("blocks.0.") for key in whole)


def test_accelerators_first_then_cpu_with_string_budgets() -> None:
    model = meta_net(blocks=4)
    device_map = infer_auto_device_map(
        model, max_memory={0: "5KB", 1: "5KB", "cpu": "1GB"}, no_split_module_classes=["Block"]
    )
    values = list(device_map.values())
    assert values[0] == 0 and "cpu" in values and "disk" not in values
    # devices are used in order: never back to an earlier one
    order = {0: 0, 1: 1, "cpu": 2}
    ranks = [order[v] for v in values]
    assert ranks == sorted(ranks)


def test_everything_fits_is_cleaned_to_root() -> None:
    assert infer_auto_device_map(meta_net(), max_memory={"cpu": "1GB"}) == {"": "cpu"}
    raw = infer_auto_device_map(meta_net(blocks=1), max_memory={"cpu": "1GB"}, clean_result=False)
    assert raw["embed"] == "cpu" and "" not in raw


def test_dtype_changes_the_plan() -> None:
    model = meta_net(blocks=4)
    sizes = compute_module_sizes(model)
    budget = sizes[""] // 2 + sizes["blocks.0"]
    fp32 = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    fp16 = infer_auto_device_map(
        model, max_memory={"cpu": budget}, no_split_module_classes=["Block"], dtype=torch.float16
    )
    assert "disk" in fp32.values() and fp16 == {"": "cpu"}


def test_tied_parameters_stay_together() -> None:
    model = meta_net(blocks=2, tie=True)
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    sizes = compute_module_sizes(model)
    budget = sizes["embed"] + sizes["blocks.0"] * 2
    device_map = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    assert device_map["embed"] == device_map["head"] == "cpu"


def test_retie_parameters() -> None:
    model = Net(tie=True)
    model.head.weight = nn.Parameter(torch.zeros_like(model.head.weight))
    retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight


def test_fallback_allocation_uses_a_device_whose_first_module_is_too_big() -> None:
    model = meta_net(blocks=2)
    sizes = compute_module_sizes(model)
    small = sizes["head"] + sizes["blocks.0.norm"] + 1  # the reserve for the largest layer, plus one norm
    with pytest.warns(UserWarning, match="Nothing was assigned"):
        plain = infer_auto_device_map(model, max_memory={0: small, "cpu": "1GB"})
    assert 0 not in plain.values()
    fallback = infer_auto_device_map(model, max_memory={0: small, "cpu": "1GB"}, fallback_allocation=True)
    assert [k for k, v in fallback.items() if v == 0] == ["blocks.0.norm"]


def test_verbose_prints_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    infer_auto_device_map(meta_net(blocks=1), max_memory={"cpu": "2KB"}, verbose=True)
    out = capsys.readouterr().out
    assert "Treating module embed" in out and "disk" in out


def test_unknown_no_split_class_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="Blok") as info:
        infer_auto_device_map(meta_net(), max_memory={"cpu": "1GB"}, no_split_module_classes=["Blok"])
    assert "Block" in str(info.value)  # the classes that do exist are listed


@pytest.mark.parametrize(
    ("budgets", "named"), [({"cpu": "12 furlongs"}, "12 furlongs"), ({"gpu0": 10}, "gpu0"), ({-1: 10}, "-1")]
)
def test_bad_max_memory_is_an_error_naming_the_value(budgets: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        infer_auto_device_map(meta_net(), max_memory=budgets)


def test_check_device_map_errors_name_missing_and_invented_modules() -> None:
    model = meta_net(blocks=2)
    with pytest.raises(ValueError, match="blocks.1"):
        check_device_map(model, {"embed": "cpu", "blocks.0": "cpu", "head": "cpu", "scale": "cpu"})
    with pytest.raises(ValueError, match="blocks.7"):
        check_device_map(model, {"": "cpu", "blocks.7": "cpu"})
    check_device_map(model, {"embed": "cpu", "blocks": "disk", "head": 0, "scale": "cpu"})


def test_clean_device_map_merges_uniform_prefixes() -> None:
    raw = {"a.x": 0, "a.y": 0, "b.x": 1, "b.y": "cpu", "c": "cpu"}
    assert clean_device_map(raw) == {"a": 0, "b.x": 1, "b.y": "cpu", "c": "cpu"}
    assert clean_device_map({"a.x": 0, "a.y": 0}) == {"": 0}
    assert clean_device_map({"a": 0}) == {"a": 0}


def test_get_balanced_memory_spreads_over_accelerators() -> None:
    model = meta_net(blocks=8)
    total = compute_module_sizes(model)[""]
    balanced = get_balanced_memory(
        model, max_memory={0: "1GB", 1: "1GB", "cpu": "1GB"}, no_split_module_classes=["Block"]
    )
    assert balanced[0] < total and balanced[1] == 10**9
    low_zero = get_balanced_memory(model, max_memory={0: "1GB", 1: "1GB", 2: "1GB", "cpu": "1GB"}, low_zero=True)
    assert low_zero[0] == 0
    device_map = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=["Block"])
    assert {0, 1} <= set(device_map.values())
    assert get_balanced_memory(model, max_memory={"cpu": "1GB"}) == {"cpu": 10**9}


def test_planning_scales_to_many_modules() -> None:
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(5000)])
    device_map = infer_auto_device_map(model, max_memory={"cpu": 40 * 2500}, clean_result=False)
    assert len(device_map) == 5000
    assert device_map["0"] == "cpu" and device_map["4999"] == "disk"


def test_get_max_memory() -> None:
    from accel_bigmodel.device_memory import get_max_memory

    free = get_max_memory()
    assert free["cpu"] > 0 and list(free)[-1] == "cpu"
    assert get_max_memory({"cpu": "1GiB", "disk": "2GB"}) == {"cpu": 2**30, "disk": 2 * 10**9}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"\[7\]"):
            get_max_memory({7: "1GB", "cpu": "1GB"})

"""Nested-structure operations and the arithmetic of split_between_processes (in-process)."""

from __future__ import annotations

import collections
import itertools
from typing import NamedTuple

import pytest
import torch

from accel_state.nested import (
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    ignorant_find_batch_size,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from accel_state.splitting import share_bounds, split_for_process


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class Batch(collections.UserDict):
    pass


class OrderedBatch(collections.OrderedDict):
    pass


def test_recursively_apply_keeps_every_container_type() -> None:
    data = {
        "a": [torch.ones(2), (torch.zeros(1), Point(torch.ones(1), torch.ones(3)))],
        "b": "text",
        "c": OrderedBatch(t=torch.ones(2)),
    }
    out = recursively_apply(lambda t: t * 2, data)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert isinstance(out["a"][1][1], Point)
    assert isinstance(out["c"], OrderedBatch)
    assert out["a"][0].tolist() == [2.0, 2.0]
    assert out["a"][1][1].y.tolist() == [2.0, 2.0, 2.0]
    assert out["b"] == "text"


def test_recursively_apply_errors_on_other_types_when_asked() -> None:
    with pytest.raises(TypeError, match="Unsupported types"):
        recursively_apply(lambda t: t, {"a": object()}, error_on_other_type=True)


def test_send_to_device_skips_keys_and_moves_objects_with_to() -> None:
    class Movable:
        def __init__(self) -> None:
            self.where = None

        def to(self, device, non_blocking=False):
            self.where = str(device)
            return self

    t = torch.ones(2)
    batch = {"keep": t, "move": t, "obj": Movable(), "n": 3}
    out = send_to_device(batch, "cpu", skip_keys="keep")
    assert out["keep"] is t and out["move"] is t  # already on cpu: no copy
    assert out["obj"].where == "cpu" and out["n"] == 3
    meta = send_to_device({"a": torch.ones(2)}, torch.device("meta"))
    assert meta["a"].device.type == "meta"


def test_find_batch_size_and_its_errors() -> None:
    assert find_batch_size({"x": [torch.ones(5, 2)]}) == 5
    assert ignorant_find_batch_size("text") is None
    with pytest.raises(ValueError, match="empty list"):
        find_batch_size([])
    with pytest.raises(TypeError, match="got str"):
        find_batch_size({"x": "text"})


def test_concatenate_slice_listify() -> None:
    parts = [{"x": torch.ones(2, 1), "y": (torch.zeros(2),)}, {"x": torch.ones(3, 1), "y": (torch.ones(3),)}]
    joined = concatenate(parts)
    assert joined["x"].shape == (5, 1) and joined["y"][0].tolist() == [0, 0, 1, 1, 1]
    assert slice_tensors(joined, slice(0, 2))["x"].shape == (2, 1)
    assert listify({"a": torch.tensor([1, 2]), "b": torch.tensor(3.5, dtype=torch.bfloat16)}) == {"a": [1, 2], "b": 3.5}
    with pytest.raises(ValueError, match="non-empty list"):
        concatenate([])


def test_convert_to_fp32_only_touches_half_precision() -> None:
    data = {
        "h": torch.ones(2, dtype=torch.float16),
        "b": torch.ones(2, dtype=torch.bfloat16),
        "i": torch.ones(2, dtype=torch.int64),
    }
    out = convert_to_fp32(data)
    assert out["h"].dtype == torch.float32 and out["b"].dtype == torch.float32 and out["i"].dtype == torch.int64
    forward = convert_outputs_to_fp32(lambda x: x.half())
    assert forward(torch.ones(1)).dtype == torch.float32


def test_share_bounds_covers_every_item_exactly_once() -> None:
    for length, n in itertools.product(range(0, 30), range(1, 6)):
        bounds = [share_bounds(length, n, i) for i in range(n)]
        assert bounds[0][0] == 0 and bounds[-1][1] == length
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        sizes = [end - start for start, end in bounds]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_share_bounds_rejects_bad_process_numbers() -> None:
    with pytest.raises(ValueError, match="process_index 3 is outside 0..1"):
        share_bounds(10, 2, 3)
    with pytest.raises(ValueError, match="num_processes must be at least 1"):
        share_bounds(10, 0, 0)


def test_split_for_process_lists_tensors_dicts_and_padding() -> None:
    assert split_for_process([1, 2, 3, 4, 5], 2, 0) == [1, 2, 3]
    assert split_for_process([1, 2, 3, 4, 5], 2, 1) == [4, 5]
    assert split_for_process([1, 2, 3, 4, 5], 2, 1, apply_padding=True) == [4, 5, 5]
    assert split_for_process(("a", "b", "c"), 3, 2) == ("c",)
    t = torch.arange(5)
    assert split_for_process(t, 2, 1, apply_padding=True).tolist() == [3, 4, 4]
    d = split_for_process({"a": [1, 2, 3], "b": torch.arange(3)}, 2, 1, apply_padding=True)
    assert d["a"] == [3, 3] and d["b"].tolist() == [2, 2]
    with pytest.raises(ValueError, match="values of one length"):
        split_for_process({"a": [1, 2], "b": [1]}, 2, 0)

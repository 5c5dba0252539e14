"""Pure conversions: tensors and numpy scalars to numbers, configs of any JSON-able shape to what backends take."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib

import pytest
import torch

from accel_tracking.values import (
    flatten,
    normalize_config,
    normalize_values,
    scalar_config,
    strict_json,
    string_config,
    to_jsonable,
    to_python,
)


def test_tensor_and_numpy_scalars_become_python_numbers() -> None:
    np = pytest.importorskip("numpy")
    assert to_python(torch.tensor(1.5)) == 1.5 and type(to_python(torch.tensor(1.5))) is float
    assert type(to_python(torch.tensor(3))) is int
    assert to_python(torch.tensor([2.0])) == 2.0
    assert to_python(torch.tensor(2.0, requires_grad=True) * 2) == 4.0
    assert type(to_python(np.float32(0.25))) is float
    assert type(to_python(np.int64(7))) is int
    assert to_python(np.array(5.0)) == 5.0
    many = torch.tensor([1.0, 2.0])
    assert to_python(many) is many  # not a scalar: left to the backend


def test_normalize_values_converts_and_copies() -> None:
    values = {"loss": torch.tensor(0.5), "group": {"a": torch.tensor(1)}, 3: "text"}
    out = normalize_values(values)
    assert out == {"loss": 0.5, "group": {"a": 1}, "3": "text"}
    out["loss"] = 9
    assert isinstance(values["loss"], torch.Tensor)


def test_normalize_values_rejects_non_mapping_with_a_clear_error() -> None:
    with pytest.raises(TypeError, match="dict of name -> value.*list"):
        normalize_values([1, 2])


def test_config_of_any_shape_is_jsonable() -> None:
    @dataclasses.dataclass
    class Opt:
        lr: float = 0.1

    config = {
        "lr": torch.tensor(0.01),
        "layers": [64, torch.tensor(32)],
        "none": None,
        "nested": {"a": {"b": (1, 2)}, "path": pathlib.Path("/tmp/x")},
        "opt": Opt(),
        "ns": argparse.Namespace(k=1),
        "fn": len,
        "tensor": torch.ones(2),
    }
    out = normalize_config(config)
    json.dumps(out)  # JSON-able
    assert out["lr"] == pytest.approx(0.01)
    assert out["layers"] == [64, 32]
    assert out["none"] is None
    assert out["nested"] == {"a": {"b": [1, 2]}, "path": "/tmp/x"}
    assert out["opt"] == {"lr": 0.1}
    assert out["ns"] == {"k": 1}
    assert out["fn"] == str(len)
    assert out["tensor"] == [1.0, 1.0]
    assert normalize_config(argparse.Namespace(a=1)) == {"a": 1}


def test_config_that_is_not_a_mapping_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="configuration must be a dict"):
        normalize_config(["lr", 0.1])


def test_flatten_and_scalar_config() -> None:
    config = {"a": {"b": 1, "c": {"d": "x"}}, "e": [1, {"f": 2}], "g": None, "h": {}, "i": True}
    assert flatten(config) == {"a/b": 1, "a/c/d": "x", "e": [1, {"f": 2}], "g": None, "h": {}, "i": True}
    scalars = scalar_config(config)
    assert scalars == {"a/b": 1, "a/c/d": "x", "e": '[1, {"f": 2}]', "g": "None", "h": "{}", "i": True}
    assert string_config(config)["a/b"] == "1"
    assert all(isinstance(v, str) for v in string_config(config).values())


def test_strict_json_spells_nan_and_infinity() -> None:
    out = strict_json({"a": math.nan, "b": [math.inf, -math.inf], "c": 1.0})
    assert out == {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 1.0}
    json.dumps(out, allow_nan=False)
    assert to_jsonable({1: {2}}) == {"1": [2]}

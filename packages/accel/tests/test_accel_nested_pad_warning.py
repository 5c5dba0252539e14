"""``CannotPadNestedTensorWarning`` is one class, the one ``pad_across_processes`` warns with, on every
documented path (issue 37: accel-train used to define a second class that ``accel.utils`` exported)."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

PATHS = [
    "accel.utils",
    "accel.utils.operations",
    "accel.utils.other",
    "accel_state",
    "accel_state.operations",
    "accel_train.other",
]


def _nested() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


@pytest.mark.parametrize("path", PATHS)
def test_every_path_gives_the_class_pad_across_processes_warns_with(path: str) -> None:
    from accel_state.operations import CannotPadNestedTensorWarning

    assert getattr(importlib.import_module(path), "CannotPadNestedTensorWarning") is CannotPadNestedTensorWarning


def test_pytest_warns_with_the_accel_utils_class_catches_the_warning() -> None:
    import accel.utils

    nested = _nested()
    with pytest.warns(accel.utils.CannotPadNestedTensorWarning, match="nested tensor"):
        assert accel.utils.pad_across_processes(nested) is nested


def test_a_filter_on_the_accel_utils_class_silences_exactly_that_warning() -> None:
    import accel.utils

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=accel.utils.CannotPadNestedTensorWarning)
        accel.utils.pad_across_processes(_nested())
    assert [w for w in caught if "nested" in str(w.message)] == []

"""A missing optional library of the launcher is named with an install command that works (issue 37):
the repository form of the extra, since accel-launch is not on the package index."""

from __future__ import annotations

import importlib
import sys

import pytest

import accel_state.imports
from accel_launch.values import ConfigError
from accel_state.install_hints import install_hint


def test_missing_rich_names_the_extra_from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel_state.imports, "is_rich_available", lambda: False)
    monkeypatch.delitem(sys.modules, "accel_launch.rich_traceback", raising=False)
    with pytest.raises(ModuleNotFoundError) as info:
        importlib.import_module("accel_launch.rich_traceback")
    assert install_hint("accel-launch", "rich") in str(info.value)
    assert '"./packages/accel-launch[rich]"' in str(info.value)


def test_missing_sagemaker_sdk_names_the_extra_from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_launch.sagemaker import sagemaker_launch

    monkeypatch.setattr(accel_state.imports, "is_sagemaker_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        sagemaker_launch(None)
    assert install_hint("accel-launch", "sagemaker") in str(info.value)

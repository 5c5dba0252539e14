"""How the state decides on XLA, checked without torch_xla: a stand-in ``torch_xla`` package that fails
when imported proves the decision looks at the import spec only. The runs on torch_xla's real device are
in accel-train's ``test_xla_device.py`` (``nox -s xla``)."""

from __future__ import annotations

import importlib
import sys

import pytest

from accel_state import devices, imports
from accel_state.enums import DistributedType
from accel_state.state import PartialState

pytestmark = pytest.mark.skipif("torch_xla" in sys.modules, reason="torch_xla is already imported here")


@pytest.fixture
def torch_xla_installed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``torch_xla`` that find_spec finds and that raises if anything imports it."""
    package = tmp_path / "torch_xla"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('the selection imported torch_xla')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delenv("USE_TORCH_XLA", raising=False)
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)


def test_installed_torch_xla_is_chosen_without_being_imported(torch_xla_installed) -> None:
    assert imports.is_torch_xla_available()
    assert devices.detect_device_type() == "xla"
    assert devices.device_count("xla") == 1
    assert "torch_xla" not in sys.modules


@pytest.mark.parametrize("value", ["0", "false", "no", "off"])
def test_use_torch_xla_false_keeps_it_out(torch_xla_installed, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("USE_TORCH_XLA", value)
    assert not imports.is_torch_xla_available()
    assert devices.detect_device_type() != "xla"
    state = PartialState()
    assert state.distributed_type == DistributedType.NO and state.device.type == "cpu"


def test_cpu_true_and_a_pinned_device_win_over_torch_xla(torch_xla_installed, monkeypatch) -> None:
    assert devices.detect_device_type(cpu=True) == "cpu"
    state = PartialState(cpu=True)
    assert state.distributed_type == DistributedType.NO and state.device.type == "cpu"
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert devices.detect_device_type() == "cpu"


def test_a_use_torch_xla_that_is_no_yes_or_no_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USE_TORCH_XLA", "maybe")
    with pytest.raises(ValueError, match=r"USE_TORCH_XLA='maybe' is not a yes or a no: use 1/0"):
        imports.is_torch_xla_available()


def test_without_torch_xla_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed here")
    monkeypatch.delenv("USE_TORCH_XLA", raising=False)
    assert not imports.is_torch_xla_available()
    assert devices.detect_device_type() != "xla"


def test_set_seed_leaves_torch_xla_alone_once_the_run_is_on_the_cpu(torch_xla_installed) -> None:
    from accel_state.random import set_seed

    PartialState(cpu=True)
    set_seed(3)  # the stand-in torch_xla raises if imported
    assert "torch_xla" not in sys.modules

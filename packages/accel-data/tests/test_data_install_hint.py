"""``use_stateful_dataloader`` on a plain loader without torchdata names an install that works (issue 37)."""

from __future__ import annotations

import pytest

import accel_state.imports
from accel_data.config import require_stateful_dataloader
from accel_state.install_hints import install_hint


def test_missing_torchdata_names_the_extra_from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel_state.imports, "is_torchdata_stateful_dataloader_available", lambda: False)
    with pytest.raises(ImportError) as info:
        require_stateful_dataloader()
    message = str(info.value)
    assert install_hint("accel-data", "torchdata") in message
    assert "prepared loader" in message  # and the way that needs no install

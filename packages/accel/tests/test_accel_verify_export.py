"""`accel.verify` (the Python entry point of `accel verify`) and `accel.commands.verify` reach accel-launch's code."""

from __future__ import annotations

import importlib


def test_verify_is_accel_launchs_function_and_its_command_module_is_aliased() -> None:
    import accel

    assert accel.verify is importlib.import_module("accel_launch.verify").verify
    assert importlib.import_module("accel.commands.verify") is importlib.import_module("accel_launch.commands.verify")


def test_verify_reports_bad_input_without_running_anything(tmp_path) -> None:
    import accel

    result = accel.verify(str(tmp_path / "train.py"), reference="fsdp")
    assert result.exit_code == 2 and "unknown reference 'fsdp'" in result.report

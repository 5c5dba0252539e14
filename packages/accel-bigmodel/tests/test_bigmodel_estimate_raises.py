"""``estimate_command`` called from Python raises; the CLI prints one line and exits with status 1."""

from __future__ import annotations

import pytest

from accel_bigmodel.commands import estimate as command


def test_estimate_command_raises_and_the_cli_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = command.estimate_command_parser().parse_args(["no_such_module_anywhere:build", "--dtypes", "float32"])
    with pytest.raises((ValueError, ImportError)):
        command.estimate_command(args)
    assert command.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("accel estimate-memory:") and "no_such_module_anywhere" in err

"""accel test's closing line says what happened: failed checks by name, or a process that stopped
before reporting any check (then there are no FAIL lines to point at)."""

from __future__ import annotations

import argparse

import pytest

from accel_train.commands import test as test_command

CRASHES = "raise RuntimeError('Numpy is not available')\n"
FAILS_A_CHECK = (
    "import sys\nprint('FAIL  collectives (process 0):\\n  mismatch', file=sys.stderr)\n"
    "print('FAIL  collectives (process 1):\\n  mismatch', file=sys.stderr)\nsys.exit(1)\n"
)


@pytest.mark.parametrize(
    ("body", "expected", "not_expected"),
    [
        (CRASHES, "before it could report its checks", "see the FAIL lines above"),
        (FAILS_A_CHECK, "collectives; see the FAIL lines above", "before it could report"),
    ],
)
def test_failure_summary_matches_what_was_printed(
    body: str, expected: str, not_expected: str, tmp_path, monkeypatch, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "selftest.py"
    script.write_text(body)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no user config: one local process
    monkeypatch.setattr(test_command, "script_path", lambda: str(script))
    assert test_command.run(argparse.Namespace(config_file=None)) != 0
    err = capfd.readouterr().err
    assert expected in err and not_expected not in err
    if body is CRASHES:
        assert "Numpy is not available" in err  # the child's own error still reaches the user

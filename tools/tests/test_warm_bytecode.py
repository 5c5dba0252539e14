"""tools/warm_bytecode.py: it imports what is installed, skips what is not, and reports (never raises on)
a module that fails to import; a real import writes the module's bytecode."""

from __future__ import annotations

import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import warm_bytecode


def test_installed_modules_are_imported_and_missing_ones_skipped() -> None:
    lines = warm_bytecode.warm(["json", "accel_no_such_package.sub", "email.mime.text"])
    assert [line.split(":")[0] for line in lines] == ["json", "email.mime.text"]
    assert "email.mime.text" in sys.modules


def test_a_module_that_fails_to_import_is_reported_not_raised(tmp_path: pathlib.Path, monkeypatch) -> None:
    (tmp_path / "warm_broken_module.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lines = warm_bytecode.warm(["warm_broken_module"])
    assert lines == ["warm_broken_module: not imported (RuntimeError: broken on purpose)"]


def test_the_script_writes_the_bytecode_of_what_it_imports(tmp_path: pathlib.Path) -> None:
    package = tmp_path / "warm_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    script = pathlib.Path(warm_bytecode.__file__)
    out = subprocess.run([sys.executable, str(script), "warm_probe_pkg"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "warm_bytecode: 1 modules" in out.stdout and "warm_probe_pkg:" in out.stdout
    assert list((package / "__pycache__").glob("__init__.*.pyc")), "no bytecode written"

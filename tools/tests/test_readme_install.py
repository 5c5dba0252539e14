"""The README's install commands name real folders, and nothing in the repository points outside it."""

from __future__ import annotations

import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _install_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def test_full_install_names_every_distribution_folder() -> None:
    blocks = _install_blocks()
    assert blocks, "README.md has no bash block under '## Install'"
    full = blocks[0].replace("\\\n", " ")
    named = re.findall(r"\./packages/([A-Za-z0-9_-]+)", full)
    folders = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))
    assert sorted(named) == folders
    assert "-c tools/constraints.txt" in full and (ROOT / "tools" / "constraints.txt").is_file()


def test_every_install_path_exists_and_no_bare_registry_name() -> None:
    for block in _install_blocks():
        command = block.replace("\\\n", " ")
        for path in re.findall(r"\./packages/[A-Za-z0-9_-]+", command):
            assert (ROOT / path / "pyproject.toml").is_file(), path
        # "pip install accel" alone would fetch an unrelated project from the public index
        assert not re.search(r"pip install (-\S+ )*accel\b(?!-)", command), command


def test_no_file_points_outside_the_repository() -> None:
    offenders = []
    # the walk does not enter the folders left out: .nox alone holds a venv per session, hundreds of
    # thousands of files in CI, which a walk of everything then filtered spent seconds of CPU on
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"__pycache__", "_build"}]
        for name in files:
            path = pathlib.Path(folder, name)
            if name.startswith(".") or path.suffix not in {".md", ".py", ".toml", ".txt", ".yml", ".yaml", ".cfg"}:
                continue
            text = path.read_text(errors="replace") if path.is_file() else ""
            if "../shared/" in text or "/work/shared" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [test_file for test_file in offenders if test_file.endswith("test_readme_install.py")]

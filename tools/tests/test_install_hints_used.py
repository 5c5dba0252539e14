"""Install commands in messages and pages are ones that work (issue 37).

The accel distributions are not on the package index, so a command that installs one of them (or an
extra of one) by its index name fails. Messages get their command from
``accel_state.install_hints.install_hint``; pages spell the repository form of the README. These tests
read the repository's text so that no file writes such a command by hand again.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("state", "data", "bigmodel", "quant", "tracking", "train", "launch")
# `pip install` (flags allowed) of an accel distribution by index name: any accel name with an extra
# in brackets, or a layer's name; a folder (`./packages/accel-train[...]`) does not match.
_FLAGS = r"(?:-{1,2}[A-Za-z][\w-]*\s+)*"
INDEX_NAME_INSTALL = re.compile(
    rf"""pip\s+install\s+{_FLAGS}["']?accel(?:(?:-(?:{"|".join(LAYERS)}))?\[|-(?:{"|".join(LAYERS)})\b)"""
)
LITERAL_HINT = re.compile(r"""install_hint\(\s*["']([^"']+)["']\s*(?:,\s*["']([^"']+)["']\s*)?\)""")


def _text_files() -> list[pathlib.Path]:
    """Sources, tests, examples, tools and pages; changelogs (history) and build output left out.

    The walk does not enter the folders it leaves out: ``.nox`` alone holds a venv per session, hundreds of
    thousands of files in CI, which a walk of everything then filtered spent seconds of CPU on.
    """
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in {"__pycache__", "build", "_build"})
        for name in sorted(files):
            path = pathlib.Path(folder, name)
            if name.startswith(".") or name == "CHANGELOG.md":
                continue
            if path.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt"} and path.is_file():
                found.append(path)
    return found


def test_the_pattern_catches_the_failing_forms_and_spares_the_working_ones() -> None:
    pip = "pip install "  # kept apart from the names below, so that this file passes its own scan
    failing = [
        pip + '"accel-bigmodel[transformers]"',
        pip + "'accel-train[megatron]'",
        pip + "-U accel-launch",
        pip + '"accel[all]"',
        "python3 -m " + pip + "--upgrade accel-data[torchdata]",
    ]
    working = [
        'python3 -m pip install -c tools/constraints.txt "./packages/accel-train[deepspeed]"',
        "python3 -m pip install -c tools/constraints.txt ./packages/accel-state ./packages/accel-launch",
        "pip install lomo-optim",
        'pip install "deepspeed>=0.18.2"',
    ]
    assert all(INDEX_NAME_INSTALL.search(text) for text in failing)
    assert not any(INDEX_NAME_INSTALL.search(text) for text in working)


def test_no_file_installs_an_accel_distribution_by_its_index_name() -> None:
    offenders = []
    for path in _text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if INDEX_NAME_INSTALL.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "use accel_state.install_hints.install_hint (or the README's form):\n" + "\n".join(
        offenders
    )


def test_every_literal_hint_in_the_sources_names_a_real_distribution_and_extra() -> None:
    sys.path.insert(0, str(ROOT / "packages" / "accel-state" / "src"))
    try:
        from accel_state.install_hints import install_hint
    finally:
        sys.path.pop(0)
    calls = []
    for source in sorted(ROOT.glob("packages/*/src/**/*.py")):
        calls += LITERAL_HINT.findall(source.read_text(encoding="utf-8"))
    assert len(calls) >= 15, calls  # the messages of issue 37 go through the helper
    for distribution, extra in calls:
        install_hint(distribution, extra or None)  # raises ValueError for a name or extra that does not exist


@pytest.mark.parametrize("page", ["megatron.md", "clusters.md", "checkpoints.md", "troubleshooting.md"])
def test_guide_pages_install_extras_from_the_repository(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert "python3 -m pip install -c tools/constraints.txt" in text
    assert re.search(r'"\./packages/accel-[a-z]+\[[\w-]+\]"', text)

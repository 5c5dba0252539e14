"""Docstrings use Markdown, which the API reference (mkdocstrings) renders (issue 37).

A Sphinx role such as ``:class:`X``` is shown literally on the site, colons and all; docstrings write a
code span (`` `X` ``) instead.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPHINX_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|mod|data|exc|obj):`")


def test_the_role_pattern_finds_what_the_site_would_show_raw() -> None:
    role = ":" + "class:`Accelerator`"  # split so that this file passes its own scan
    assert SPHINX_ROLE.search(f"returns a {role}")
    assert not SPHINX_ROLE.search("returns an `Accelerator` (see ``Accelerator.prepare``)")


def test_no_source_uses_sphinx_roles() -> None:
    found = []
    for path in sorted(ROOT.glob("packages/*/src/**/*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SPHINX_ROLE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == [], "write a Markdown code span instead of a Sphinx role:\n" + "\n".join(found)

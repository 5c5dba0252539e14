"""Bump one distribution's version, the ranges its dependents declare on it, and its CHANGELOG heading.

    python tools/bump_version.py accel-data minor        # 0.1.0 -> 0.2.0
    python tools/bump_version.py accel-data 0.1.1        # an explicit version

Dependents get the compatible range ``>=X.Y,<X.(Y+1)`` for 0.x versions (``>=X.Y,<(X+1)`` from 1.0);
the meta-package pins ``==`` the new version. The ``## Unreleased`` heading of the CHANGELOG becomes
``## X.Y.Z (date)`` under a fresh ``## Unreleased``.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from repo import ROOT, distributions


def next_version(current: str, part: str) -> str:
    """``current`` bumped by ``part`` (major, minor, patch), or ``part`` itself when it is a version."""
    if re.fullmatch(r"\d+\.\d+\.\d+", part):
        return part
    major, minor, patch = (int(x) for x in current.split(".")[:3])
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise ValueError(f"part must be major, minor, patch or a version X.Y.Z, got {part!r}")


def compatible_range(version: str) -> str:
    """The range a dependent declares on ``version``."""
    major, minor, _ = (int(x) for x in version.split("."))
    if major == 0:
        return f">={major}.{minor},<{major}.{minor + 1}"
    return f">={major}.{minor},<{major + 1}"


def rewrite_requirement(text: str, name: str, spec: str) -> tuple[str, int]:
    """``text`` (a pyproject) with the requirement on ``name`` given ``spec``; and how many were changed."""
    pattern = re.compile(rf'"{re.escape(name)}(\[[^\]]*\])?\s*[<>=!~][^"]*"')
    return pattern.subn(lambda m: f'"{name}{m.group(1) or ""}{spec}"', text)


def bump(name: str, part: str, root: pathlib.Path = ROOT, today: datetime.date | None = None) -> str:
    """Apply the bump in ``root``; returns the new version."""
    dists = distributions(root)
    if name not in dists:
        raise SystemExit(f"unknown distribution {name!r}; known: {', '.join(sorted(dists))}")
    dist = dists[name]
    new = next_version(dist.version, part)
    about = dist.about.read_text()
    dist.about.write_text(re.sub(r'(__version__\s*=\s*")[^"]+(")', rf"\g<1>{new}\2", about, count=1))
    for other in dists.values():
        if name not in other.requires:
            continue
        pyproject = other.root / "pyproject.toml"
        spec = f"=={new}" if other.name == "accel" else compatible_range(new)
        text, count = rewrite_requirement(pyproject.read_text(), name, spec)
        if count:
            pyproject.write_text(text)
    changelog = dist.root / "CHANGELOG.md"
    if changelog.exists():
        date = (today or datetime.date.today()).isoformat()
        text = changelog.read_text()
        if "## Unreleased" in text:
            text = text.replace("## Unreleased", f"## Unreleased\n\n## {new} ({date})", 1)
        else:
            text = re.sub(r"^(# .*\n)", rf"\1\n## {new} ({date})\n", text, count=1)
        changelog.write_text(text)
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("distribution")
    parser.add_argument("part", help="major, minor, patch, or an explicit X.Y.Z")
    args = parser.parse_args(argv)
    print(bump(args.distribution, args.part))
    return 0


if __name__ == "__main__":
    sys.exit(main())

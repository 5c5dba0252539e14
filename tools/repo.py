"""What the tools know about the repository: its distributions, versions and in-repo requirements."""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_VERSION_RE = re.compile(r'^(__version__\s*=\s*")([^"]+)(")', re.M)


@dataclass
class Distribution:
    """One distribution of packages/: its folder, import package, version and in-repo requirements."""

    name: str
    root: pathlib.Path
    package: str
    version: str
    requires: list[str] = field(default_factory=list)

    @property
    def about(self) -> pathlib.Path:
        return self.root / "src" / self.package / "__about__.py"


def distributions(root: pathlib.Path = ROOT) -> dict[str, Distribution]:
    """Every distribution under ``root/packages``, by name."""
    found: dict[str, Distribution] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        src = pyproject.parent / "src"
        package = next(p.name for p in sorted(src.iterdir()) if p.is_dir() and not p.name.startswith("."))
        match = _VERSION_RE.search((src / package / "__about__.py").read_text())
        if not match:
            raise ValueError(f'{src / package / "__about__.py"}: no __version__ = "..." line')
        requires = [re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0] for r in project.get("dependencies", [])]
        found[project["name"]] = Distribution(project["name"], pyproject.parent, package, match.group(2), requires)
    names = set(found)
    for dist in found.values():
        dist.requires = [r for r in dist.requires if r in names]
    return found


def dependents(dists: dict[str, Distribution], name: str) -> list[str]:
    """Every distribution that needs ``name``, directly or through others."""
    out: list[str] = []
    frontier = [name]
    while frontier:
        current = frontier.pop()
        for other in dists.values():
            if current in other.requires and other.name not in out:
                out.append(other.name)
                frontier.append(other.name)
    return sorted(out)

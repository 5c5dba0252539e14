"""Which distributions a change touches: those with changed files, plus everything that depends on them.

    python tools/affected.py                 # against origin/main (or HEAD~1 when there is no remote)
    python tools/affected.py --base v0.1.0   # against any git revision
    python tools/affected.py --files a b     # for an explicit list of paths

A change outside packages/ (tools, noxfile, CI) affects every distribution.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from repo import ROOT, Distribution, dependents, distributions

_NEUTRAL = ("docs/", "README.md", "examples/", ".gitignore")


def affected(changed: list[str], dists: dict[str, Distribution]) -> list[str]:
    """Distributions touched by ``changed`` (paths relative to the repository root), dependents included."""
    by_folder = {dist.root.relative_to(ROOT).as_posix() + "/": name for name, dist in dists.items()}
    hit: set[str] = set()
    for path in changed:
        owner = next((name for folder, name in by_folder.items() if path.startswith(folder)), None)
        if owner is not None:
            hit.add(owner)
            hit.update(dependents(dists, owner))
        elif not path.startswith(_NEUTRAL):
            return sorted(dists)
    return sorted(hit)


def changed_files(base: str | None) -> list[str]:
    if base is None:
        has_remote = (
            subprocess.run(
                ["git", "rev-parse", "--verify", "-q", "origin/main"], cwd=ROOT, capture_output=True
            ).returncode
            == 0
        )
        base = "origin/main" if has_remote else "HEAD~1"
    out = subprocess.run(["git", "diff", "--name-only", base], cwd=ROOT, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="git revision to compare with")
    parser.add_argument("--files", nargs="*", help="explicit changed paths instead of git")
    args = parser.parse_args(argv)
    files = args.files if args.files is not None else changed_files(args.base)
    for name in affected(files, distributions()):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

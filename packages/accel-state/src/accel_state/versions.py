"""Version comparison without a dependency on ``packaging``."""

from __future__ import annotations

import importlib.metadata
import operator
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}
_PRE = {"dev": -4, "a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "c": -1}


@lru_cache(maxsize=256)
def parse_version(text: str) -> tuple[Any, ...]:
    """A tuple that orders release versions like PEP 440 does for the common cases (local part ignored)."""
    text = text.strip().lower().lstrip("v").split("+")[0]
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", text)
    if not match:
        raise ValueError(f"cannot parse version {text!r}")
    release = [int(p) for p in match.group(1).split(".")]
    while len(release) < 4:
        release.append(0)
    rest = match.group(2).lstrip(".-_")
    pre: tuple[int, int] = (0, 0)
    post = 0
    m = re.match(r"^(dev|a|alpha|b|beta|rc|c)\.?(\d*)", rest)
    if m:
        pre = (_PRE[m.group(1)], int(m.group(2) or 0))
    m = re.search(r"post\.?(\d*)", rest)
    if m:
        post = int(m.group(1) or 0)
    return (tuple(release), pre, post)


def compare_versions(library_or_version: str, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (or a version string) with ``requirement_version``.

    Args:
        library_or_version: An installed package's name, or a version (string or `packaging` version).
        operation: A comparison as a string: `<`, `<=`, `==`, `!=`, `>=` or `>`.
        requirement_version: The version to compare against.
    """
    if operation not in _OPS:
        raise ValueError(f"operation {operation!r} must be one of {list(_OPS)}")
    version = library_or_version
    if not re.match(r"^v?\d", library_or_version):
        version = importlib.metadata.version(library_or_version)
    return _OPS[operation](parse_version(version), parse_version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version with ``version`` (for example ``is_torch_version(">=", "2.4")``).

    Args:
        operation: A comparison as a string: `<`, `<=`, `==`, `!=`, `>=` or `>`.
        version: The version to compare the installed torch against.
    """
    return compare_versions(torch_version(), operation, version)


@lru_cache(maxsize=1)
def torch_version() -> str:
    """Installed torch version, read from its metadata (does not import torch)."""
    return importlib.metadata.version("torch")

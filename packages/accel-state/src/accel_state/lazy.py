"""Module ``__getattr__`` / ``__dir__`` for packages whose public names load on first use.

Every accel package keeps ``import <package>`` cheap this way: a table maps each public name to the
sub-module defining it, and the sub-module is imported when the name is first touched. This module
imports nothing heavy (not even ``typing`` at run time), so the CLI can use it.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names ``exports`` maps to sub-modules.

    Sub-module names are relative to the package (``"state"`` for ``accel_state.state``). A name is
    cached in the package once loaded; an unknown name is the usual ``AttributeError``.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(getattr(sys.modules[package], "__all__", exports))

    return __getattr__, __dir__

"""Register documented module paths (``accel.state``, ``accel.utils.modeling``, ...) as aliases.

An alias is the real module of the owning package under a second name in ``sys.modules`` (the same
object, not a copy), so ``mock.patch("accel.utils.modeling.X")`` patches the code that runs.
Submodules of an alias are aliases too. ``python -m accel.commands.<name>`` runs the real module's
code as ``__main__`` through `AliasLoader.get_code()`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from types import CodeType, ModuleType
from typing import Any


class AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing its target and returning that very module."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module was executed when it was imported."""

    def get_code(self, fullname: str) -> CodeType | None:
        """The target's code, so that ``python -m <alias>`` runs the real module as ``__main__``."""
        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot find {self.target}, the module behind {fullname}")
        return spec.loader.get_code(self.target)  # type: ignore[attr-defined, no-any-return]

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.target)
        return bool(spec is not None and spec.submodule_search_locations is not None)


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds modules named in the alias table, and submodules of aliased packages."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = dict(table)

    def target_of(self, fullname: str) -> str | None:
        """Real module name behind ``fullname``, or None if it is not an alias."""
        if fullname in self.table:
            return self.table[fullname]
        head, _, _ = fullname.rpartition(".")
        while head:
            if head in self.table:
                return f"{self.table[head]}.{fullname[len(head) + 1 :]}"
            head, _, _ = head.rpartition(".")
        return None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        real = self.target_of(fullname)
        if real is None:
            return None
        try:
            real_spec = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            real_spec = None
        if real_spec is None:
            return None
        loader = AliasLoader(real)
        spec = importlib.machinery.ModuleSpec(
            fullname, loader, origin=real_spec.origin, is_package=real_spec.submodule_search_locations is not None
        )
        return spec


def install(table: Mapping[str, str]) -> AliasFinder:
    """Put one alias finder for ``table`` at the front of ``sys.meta_path`` (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder):
            finder.table.update(table)
            return finder
    finder = AliasFinder(table)
    sys.meta_path.insert(0, finder)
    return finder


def lazy_attribute(module_name: str, name: str, table: Mapping[str, str]) -> Any:
    """Value of ``name`` from the module that ``table`` names for it (an AttributeError if none)."""
    source = table.get(name)
    if source is None:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    return getattr(importlib.import_module(source), name)

"""A table of classes by name, each imported on first use: the registries of strategies and precisions.

Entries are ``"module:Class"`` strings, so a backend's module (and the library behind it) is imported
only when a run asks for it; a class can also be registered directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["Registry"]


class Registry:
    """``name -> "module:Class"``, with a hook that raises the right error for a name not registered."""

    def __init__(self, kind: str, table: dict[str, str], missing: Callable[[str], Exception]) -> None:
        self.kind = kind
        self.table = table
        self._missing = missing
        self._loaded: dict[str, type] = {}

    def register(self, name: str, target: str | type, replace: bool = False) -> None:
        """Register ``target`` (a class or its ``"module:Class"`` path) under ``name``."""
        if name in self.table and not replace:
            raise ValueError(
                f"a {self.kind} named {name!r} is already registered ({self.table[name]}); pass replace=True"
            )
        if isinstance(target, type):
            self._loaded[name] = target
            self.table[name] = f"{target.__module__}:{target.__qualname__}"
            return
        if ":" not in target:
            raise ValueError(f"{self.kind} target must be 'module:Class', got {target!r}")
        self._loaded.pop(name, None)
        self.table[name] = target

    def get(self, name: str) -> Any:
        """The class registered under ``name``, imported now if needed."""
        if name in self._loaded:
            return self._loaded[name]
        target = self.table.get(name)
        if target is None:
            raise self._missing(name)
        module_name, _, class_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        self._loaded[name] = cls
        return cls

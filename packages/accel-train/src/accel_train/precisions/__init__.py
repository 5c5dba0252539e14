"""Precisions: how numbers are represented in the forward, backward and optimizer step.

One class per mode, registered by the ``mixed_precision`` value it serves in :data:`PRECISIONS`
(``mode -> "module:Class"``, imported on first use). FP8 and other modes plug in by adding a module
here and a line in the table (or :func:`register_precision` from outside).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_train.precisions.base import Precision

__all__ = ["PRECISIONS", "precision_class", "register_precision"]

#: ``mixed_precision`` value -> ``"module:Class"``.
PRECISIONS: dict[str, str] = {
    "no": "accel_train.precisions.base:Precision",
    "fp16": "accel_train.precisions.amp:AutocastPrecision",
    "bf16": "accel_train.precisions.amp:AutocastPrecision",
    "fp8": "accel_train.precisions.fp8:FP8Precision",
}

_MISSING: dict[str, str] = {}

_LOADED: dict[str, type] = {}


def register_precision(mode: str, target: str | type[Precision], replace: bool = False) -> None:
    """Register the precision class (or ``"module:Class"``) that serves ``mixed_precision=mode``."""
    if mode in PRECISIONS and not replace:
        raise ValueError(f"a precision for {mode!r} is already registered ({PRECISIONS[mode]}); pass replace=True")
    if isinstance(target, type):
        _LOADED[mode] = target
        PRECISIONS[mode] = f"{target.__module__}:{target.__qualname__}"
    else:
        if ":" not in target:
            raise ValueError(f"precision target must be 'module:Class', got {target!r}")
        _LOADED.pop(mode, None)
        PRECISIONS[mode] = target


def precision_class(mode: str) -> type[Precision]:
    """The class registered for ``mode``; a clear error for a documented mode not available."""
    if mode in _LOADED:
        return _LOADED[mode]
    target = PRECISIONS.get(mode)
    if target is None:
        if mode in _MISSING:
            raise NotImplementedError(_MISSING[mode])
        raise ValueError(f"no precision for mixed_precision={mode!r}; choose one of {sorted(PRECISIONS)}")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    _LOADED[mode] = cls
    return cls

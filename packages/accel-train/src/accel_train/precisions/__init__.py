"""Precisions: how numbers are represented in the forward, backward and optimizer step.

One class per mode, registered by the ``mixed_precision`` value it serves in `PRECISIONS`
(``mode -> "module:Class"``, imported on first use). FP8 and other modes plug in by adding a module
here and a line in the table (or `register_precision()` from outside).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel_train.registry import Registry

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


def _missing(mode: str) -> Exception:
    if mode in _MISSING:
        return NotImplementedError(_MISSING[mode])
    return ValueError(f"no precision for mixed_precision={mode!r}; choose one of {sorted(PRECISIONS)}")


_REGISTRY = Registry("precision", PRECISIONS, _missing)


def register_precision(mode: str, target: str | type[Precision], replace: bool = False) -> None:
    """Register the precision class (or ``"module:Class"``) that serves ``mixed_precision=mode``."""
    _REGISTRY.register(mode, target, replace)


def precision_class(mode: str) -> type[Precision]:
    """The class registered for ``mode``; a clear error for a documented mode not available."""
    return _REGISTRY.get(mode)  # type: ignore[no-any-return]

"""``accel.utils``: every documented utility, loaded from its owning package on first use.

Its sub-modules (``accel.utils.modeling``, ``accel.utils.operations``, ...) are aliases of the real
modules, registered by the meta-package.
"""

from __future__ import annotations

from typing import Any

from accel import _aliases, _exports

__all__ = sorted(_exports.UTILS)


def __getattr__(name: str) -> Any:
    value = _aliases.lazy_attribute("accel.utils", name, _exports.UTILS)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

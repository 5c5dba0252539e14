"""accel: one PyTorch script on CPU, GPU, many GPUs or many machines, and models bigger than memory.

This meta-package owns no code: it re-exports the public names of the seven accel distributions,
lazily, and registers the documented module paths (``accel.state``, ``accel.utils.modeling``, ...)
as aliases of the real modules. ``import accel`` imports neither torch nor any sub-package.
"""

from __future__ import annotations

from typing import Any

from accel import _aliases, _exports
from accel.__about__ import __version__

_aliases.install(_exports.MODULES)

__all__ = ["__version__", *sorted(_exports.TOP_LEVEL)]


_SUBMODULES = {path.split(".")[1] for path in _exports.MODULES if path.count(".") == 1} | {"commands", "utils"}


def __getattr__(name: str) -> Any:
    if name not in _exports.TOP_LEVEL and name in _SUBMODULES:
        # documented sub-modules are attributes of the package, as after the documented system's import
        import importlib

        value = importlib.import_module(f"accel.{name}")
    else:
        value = _aliases.lazy_attribute("accel", name, _exports.TOP_LEVEL)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

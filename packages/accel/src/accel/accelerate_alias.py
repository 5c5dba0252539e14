"""Opt-in: let libraries that ``import accelerate`` use accel, with the documented system not installed.

Switch it on with the environment variable ``ACCEL_PROVIDE_ACCELERATE=1`` (read at interpreter start by
the ``accel_provide_accelerate.pth`` file the meta-package installs), or call `install()` before the
library is imported. Then:

- ``import accelerate`` is the ``accel`` module itself, and every ``accelerate.x.y`` is the module
  ``accel.x.y`` resolves to (the real module of the owning package): the same objects, not copies;
- the package-metadata check such libraries make (``importlib.metadata.version("accelerate")``,
  ``importlib.metadata.distribution("accelerate")``) answers with `PROVIDED_VERSION`.

It refuses to shadow a real ``accelerate`` installation: `install()` then warns and does nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from accel import _aliases
from accel.__about__ import __version__

ENV_VAR = "ACCEL_PROVIDE_ACCELERATE"

# The documented release whose behaviour accel follows, with accel's own version as a PEP 440 local
# label: version checks such as ``accelerate>=1.1.0`` pass, and the text says what it really is.
DOCUMENTED_RELEASE = "1.15.0"
PROVIDED_VERSION = f"{DOCUMENTED_RELEASE}+accel.{__version__}"
# Where the API accel serves under that name is documented. Libraries check the home page of the
# installed ``accelerate`` before they train (sentence-transformers wants its publisher's name in it).
DOCUMENTED_API_PAGE = "https://huggingface.co/docs/accelerate"

_METADATA = f"""Metadata-Version: 2.1
Name: accelerate
Version: {PROVIDED_VERSION}
Summary: Provided by accel {__version__} (ACCEL_PROVIDE_ACCELERATE): accelerate's documented API, served by accel's modules.
Home-page: {DOCUMENTED_API_PAGE}
"""


class ProvidedDistribution(importlib.metadata.Distribution):
    """Package metadata of ``accelerate`` as accel provides it (no files of its own)."""

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return _METADATA
        if filename == "top_level.txt":
            return "accelerate\n"
        return None

    def locate_file(self, path: Any) -> Any:
        import pathlib

        return pathlib.Path(__file__).parent / str(path)


class ProvidedDistributionFinder(importlib.metadata.DistributionFinder):
    """Answers metadata queries for ``accelerate`` (and for "all distributions") with `ProvidedDistribution`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        return None  # modules are the alias finder's job

    def find_distributions(self, context: Any = None) -> Iterable[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or name.lower().replace("_", "-") == "accelerate":
            yield ProvidedDistribution()


def real_accelerate_installed() -> bool:
    """True when a real ``accelerate`` package or distribution exists (then accel provides nothing)."""
    if is_installed():
        return False
    try:
        importlib.metadata.distribution("accelerate")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    return importlib.machinery.PathFinder.find_spec("accelerate") is not None


def is_installed() -> bool:
    """True when this process resolves ``accelerate`` to accel."""
    return any(isinstance(finder, ProvidedDistributionFinder) for finder in sys.meta_path)


def install() -> bool:
    """Make ``import accelerate`` and its metadata resolve to accel in this process; True when active.

    Call it before the library that imports ``accelerate`` is imported. Idempotent.
    """
    if is_installed():
        return True
    if real_accelerate_installed():
        warnings.warn(
            f"{ENV_VAR}: a real `accelerate` is installed here, so accel does not stand in for it "
            "(uninstall it to use accel under that name).",
            stacklevel=2,
        )
        return False
    _aliases.install({"accelerate": "accel"})
    sys.meta_path.append(ProvidedDistributionFinder())
    return True


def requested(environ: Any = None) -> bool:
    """True when the environment asks for the alias (``ACCEL_PROVIDE_ACCELERATE`` is 1/true/yes/on)."""
    value = (environ if environ is not None else os.environ).get(ENV_VAR, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def install_if_requested() -> bool:
    """What the ``.pth`` start-up hook runs: `install()` when `requested()`."""
    return install() if requested() else False

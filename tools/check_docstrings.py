"""Every public name a package exports has a docstring (the API reference is generated from them).

    python tools/check_docstrings.py                 # every distribution's import package
    python tools/check_docstrings.py accel_state     # just these

A package's public names are its ``__all__``. Each name that is a class, a function or another
callable must carry its own docstring: a class inheriting its parent's text does not count, and
neither does the default text Python gives enums and dataclasses. Modules and plain values
(constants, dicts) are not checked. Prints every name missing one and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import sys

PACKAGES = (
    "accel_state",
    "accel_data",
    "accel_bigmodel",
    "accel_quant",
    "accel_tracking",
    "accel_train",
    "accel_launch",
    "accel",
)


def own_docstring(obj: object) -> str:
    """The docstring written for ``obj`` itself ("" when it only inherits or gets a generated one)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        if issubclass(obj, enum.Enum) and doc.strip() == "An enumeration.":
            return ""
        if doc.startswith(f"{obj.__name__}(") and "__dataclass_fields__" in obj.__dict__:
            return ""  # the signature dataclasses put there when the class has no docstring
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def undocumented(package: str) -> list[str]:
    """Public names of ``package`` (its ``__all__``) that need a docstring and have none."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        return [f"{package} has no __all__: its public names are not declared"]
    missing = []
    for name in names:
        if name.startswith("_"):
            continue
        try:
            value = getattr(module, name)
        except Exception as error:  # a broken lazy export is an error of its own
            missing.append(f"{package}.{name} (cannot be imported: {error})")
            continue
        if inspect.ismodule(value) or not callable(value):
            continue
        if not own_docstring(value):
            missing.append(f"{package}.{name}")
    return missing


def main(argv: list[str] | None = None) -> int:
    """Check the packages named (default: all eight); print what is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    args = parser.parse_args(argv)
    problems: list[str] = []
    checked = 0
    for package in args.packages:
        problems += undocumented(package)
        checked += len(getattr(importlib.import_module(package), "__all__", []))
    for problem in problems:
        print(f"no docstring: {problem}")
    print(f"docstrings: {checked} public names in {len(args.packages)} packages, {len(problems)} without one")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the export tables of packages that declare their own (``python -m accel._exports.generate``).

A package declares what it gives the meta-package with a ``meta_exports()`` function in its
``__init__`` (``TOP_LEVEL`` / ``UTILS``: name -> module, ``MODULES``: documented path -> module). The
table module here is generated from it, so the names are written once, in the owning package; the
meta-package's tests check that every generated table is up to date. Importing ``accel`` never runs
this: the generated modules are plain dicts.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

#: Table module of the meta-package -> the distribution's import package that declares it.
GENERATED: dict[str, str] = {"train": "accel_train"}

_HEADER = '''"""Names and module paths that {package} provides to the meta-package.

GENERATED from ``{package}.meta_exports()`` by ``python -m accel._exports.generate``: do not edit;
change the package's own lists and run the command.
"""

'''


def render(table: str) -> str:
    """The source of the generated table module ``accel._exports.<table>``."""
    package = GENERATED[table]
    tables = importlib.import_module(package).meta_exports()
    parts = [_HEADER.format(package=package).rstrip("\n") + "\n"]
    for key in ("TOP_LEVEL", "UTILS", "MODULES"):
        entries = "".join(
            f"    {name!r}: {target!r},\n".replace("'", '"') for name, target in sorted(tables[key].items())
        )
        parts.append(f"{key}: dict[str, str] = {{\n{entries}}}\n")
    return "\n".join(parts)


def path_of(table: str) -> pathlib.Path:
    """Where the generated table module lives."""
    return pathlib.Path(__file__).with_name(f"{table}.py")


def main() -> int:
    """Regenerate every table; print the ones that changed."""
    for table in GENERATED:
        text = render(table)
        path = path_of(table)
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Docstring coverage of the public API: members with a docstring, arguments with a description.

    python tools/check_docstrings.py                      # report, then compare with the baseline
    python tools/check_docstrings.py --list accel-state   # every gap of one distribution
    python tools/check_docstrings.py --update-baseline    # write the current gaps as the new baseline

The public surface is found at run time, never typed by hand: every name in the ``__all__`` of the
eight import packages and of ``accel.utils`` (the meta-package's export tables), and, for every class
among them, its public methods and properties wherever they are defined (a mixin, a base class, a
component), as long as that code belongs to an accel package. Each function is counted once, under the
distribution whose module defines it, however many names reach it.

A *member* is documented when it carries its own docstring (an inherited one, or the text Python
generates for enums and dataclasses, does not count). An *argument* is documented when the docstring
names it in a Google-style section: ``Args:`` (also ``Arguments:``, ``Parameters:``,
``Keyword Args:``); for a class, its constructor's arguments may be described in the class docstring,
in ``Attributes:`` (dataclass fields) too, or in the docstring of ``__init__``.

The check is a ratchet: ``tools/docstring_baseline.json`` holds, per distribution, how many members
and arguments are still undocumented. A count above its baseline fails (a new gap); a count below
prints a reminder to lower the baseline with ``--update-baseline``. The report ends with one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import json
import pathlib
import re
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tools" / "docstring_baseline.json"

#: import package -> distribution, in the dependency order of DESIGN.md.
DISTRIBUTIONS = {
    "accel_state": "accel-state",
    "accel_data": "accel-data",
    "accel_bigmodel": "accel-bigmodel",
    "accel_quant": "accel-quant",
    "accel_tracking": "accel-tracking",
    "accel_train": "accel-train",
    "accel_launch": "accel-launch",
    "accel": "accel",
}
#: Modules whose ``__all__`` is the public surface (``accel.utils`` holds the meta-package's utilities).
ROOTS = (*DISTRIBUTIONS, "accel.utils")
ARG_SECTIONS = ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters")
CLASS_ARG_SECTIONS = (*ARG_SECTIONS, "attributes")
SECTION = re.compile(r"^(?P<indent>[ \t]*)(?P<name>[A-Za-z][A-Za-z ]*):[ \t]*$")
ENTRY = re.compile(r"^(?P<stars>\*{0,2})(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:[ \t]*\([^)]*\))?[ \t]*:")


def own_docstring(obj: object) -> str:
    """The docstring written for ``obj`` itself ("" when it only inherits or gets a generated one)."""
    if isinstance(obj, property):
        return (obj.__doc__ or "").strip()
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        if issubclass(obj, enum.Enum) and doc.strip() in ("An enumeration.", ""):
            return ""
        if doc.startswith(f"{obj.__name__}(") and "__dataclass_fields__" in obj.__dict__:
            return ""  # the signature dataclasses put there when the class has no docstring
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def documented_names(doc: str, sections: tuple[str, ...] = ARG_SECTIONS) -> set[str]:
    """Names described in the given Google-style sections of ``doc`` (``name (type): text`` entries)."""
    names: set[str] = set()
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    index = 0
    while index < len(lines):
        match = SECTION.match(lines[index])
        index += 1
        if not match or match.group("name").strip().lower() not in sections:
            continue
        base = len(match.group("indent").expandtabs())
        entry_indent = None
        while index < len(lines):
            line = lines[index]
            if line.strip():
                indent = len(line) - len(line.lstrip())
                if indent <= base:
                    break
                if entry_indent is None:
                    entry_indent = indent
                if indent == entry_indent:
                    entry = ENTRY.match(line.strip())
                    if entry:
                        names.add(entry.group("name"))
            index += 1
    return names


@dataclasses.dataclass
class Member:
    """One public callable or property: its public path, owning distribution, and what it lacks."""

    path: str
    distribution: str
    has_docstring: bool
    arguments: list[str]
    undocumented_arguments: list[str]


def _distribution_of(module_name: str | None) -> str | None:
    top = (module_name or "").split(".")[0]
    return DISTRIBUTIONS.get(top)


def _parameters(func: object) -> list[str]:
    try:
        signature = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    # self/cls and private parameters (a leading underscore: internal plumbing) are not public arguments
    return [name for name in signature.parameters if name not in ("self", "cls") and not name.startswith("_")]


def _function_member(path: str, func: object, distribution: str, extra_docs: str = "") -> Member:
    doc = own_docstring(func)
    params = _parameters(func)
    described = documented_names(doc) | documented_names(extra_docs, CLASS_ARG_SECTIONS)
    missing = [name for name in params if name not in described]
    return Member(path, distribution, bool(doc), params, missing)


def _class_members(path: str, cls: type) -> Iterator[tuple[str, object, str]]:
    """``(public path, function or property, distribution)`` of every public member of ``cls``."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        distribution = _distribution_of(klass.__module__)
        if distribution is None:
            continue  # object, torch.nn.Module, enum.Enum ...: not ours to document
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                yield f"{path}.{name}", value, distribution
            elif inspect.isfunction(value):
                yield f"{path}.{name}", value, _distribution_of(value.__module__) or distribution


def public_objects(roots: tuple[str, ...] | None = None) -> Iterator[tuple[str, object]]:
    """``(public path, object)`` for every name in the ``__all__`` of the modules ``roots`` (default ``ROOTS``)."""
    for root in roots or ROOTS:
        module = importlib.import_module(root)
        for name in getattr(module, "__all__", []):
            if name.startswith("_"):
                continue
            try:
                yield f"{root}.{name}", getattr(module, name)
            except Exception as error:  # a broken lazy export is a gap of its own
                yield f"{root}.{name}", error


def collect(roots: tuple[str, ...] | None = None) -> tuple[list[Member], list[str]]:
    """Every public member reached from ``roots``, each function counted once; and the exports that
    cannot be imported."""
    members: list[Member] = []
    broken: list[str] = []
    seen: set[int] = set()

    def add(path: str, obj: object, distribution: str, extra_docs: str = "") -> None:
        key = id(obj.fget) if isinstance(obj, property) else id(obj)
        if key in seen:
            return
        seen.add(key)
        if isinstance(obj, property):
            members.append(Member(path, distribution, bool(own_docstring(obj)), [], []))
        else:
            members.append(_function_member(path, obj, distribution, extra_docs))

    for path, obj in public_objects(roots):
        if isinstance(obj, Exception):
            broken.append(f"{path} (cannot be imported: {obj})")
            continue
        if inspect.ismodule(obj) or not callable(obj):
            continue
        distribution = _distribution_of(getattr(obj, "__module__", None))
        if distribution is None:
            continue  # a re-exported third-party name
        if not inspect.isclass(obj):
            add(path, obj, distribution)
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        doc = own_docstring(obj)
        if issubclass(obj, enum.Enum):
            members.append(Member(path, distribution, bool(doc), [], []))
            continue
        init = obj.__init__ if "__init__" in vars(obj) or dataclasses.is_dataclass(obj) else None
        if init is not None and _distribution_of(getattr(init, "__module__", None)) is None:
            init = None
        params = _parameters(init) if init is not None else []
        described = documented_names(doc, CLASS_ARG_SECTIONS) | documented_names(own_docstring(init) if init else "")
        missing = [name for name in params if name not in described]
        members.append(Member(path, distribution, bool(doc), params, missing))
        for member_path, value, member_distribution in _class_members(path, obj):
            add(member_path, value, member_distribution)
    return members, broken


def figures(members: list[Member]) -> dict[str, dict[str, int]]:
    """Per distribution: public and documented members, public and documented arguments, and gaps."""
    table: dict[str, dict[str, int]] = {}
    for distribution in dict.fromkeys([*DISTRIBUTIONS.values(), *(m.distribution for m in members)]):
        own = [m for m in members if m.distribution == distribution]
        arguments = sum(len(m.arguments) for m in own)
        missing_arguments = sum(len(m.undocumented_arguments) for m in own)
        table[distribution] = {
            "members": len(own),
            "documented_members": sum(m.has_docstring for m in own),
            "arguments": arguments,
            "documented_arguments": arguments - missing_arguments,
        }
    return table


def gaps(table: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The counts the baseline holds: undocumented members and arguments per distribution."""
    return {
        dist: {
            "undocumented_members": row["members"] - row["documented_members"],
            "undocumented_arguments": row["arguments"] - row["documented_arguments"],
        }
        for dist, row in table.items()
    }


def compare(current: dict[str, dict[str, int]], baseline: dict[str, dict[str, int]]) -> tuple[list[str], list[str]]:
    """``(regressions, improvements)``: counts above the baseline, and counts below it."""
    worse, better = [], []
    for dist, counts in current.items():
        for key, value in counts.items():
            allowed = baseline.get(dist, {}).get(key, 0)
            if value > allowed:
                worse.append(f"{dist}: {value} {key.replace('_', ' ')}, the baseline allows {allowed}")
            elif value < allowed:
                better.append(f"{dist}: {value} {key.replace('_', ' ')} (baseline {allowed})")
    return worse, better


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def main(argv: list[str] | None = None) -> int:
    """Print the coverage table and the gaps asked for; exit 1 on a gap above the baseline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", nargs="*", metavar="DIST", help="print every gap (of these distributions)")
    parser.add_argument("--baseline", type=pathlib.Path, default=BASELINE)
    parser.add_argument("--update-baseline", action="store_true", help="write the current gaps as the baseline")
    args = parser.parse_args(argv)

    members, broken = collect()
    table = figures(members)
    print(f"{'distribution':16} {'members documented':>26} {'arguments documented':>28}")
    for dist, row in table.items():
        print(
            f"{dist:16} {row['documented_members']:>8} / {row['members']:<5} {_percent(row['documented_members'], row['members'])}"
            f"   {row['documented_arguments']:>8} / {row['arguments']:<5} {_percent(row['documented_arguments'], row['arguments'])}"
        )
    if args.list is not None:
        for member in members:
            if args.list and member.distribution not in args.list:
                continue
            if not member.has_docstring:
                print(f"no docstring: {member.path}")
            if member.undocumented_arguments:
                print(f"undocumented argument(s) of {member.path}: {', '.join(member.undocumented_arguments)}")
    for problem in broken:
        print(f"broken export: {problem}")

    current = gaps(table)
    if args.update_baseline:
        args.baseline.write_text(json.dumps(current, indent=2) + "\n")
        print(f"baseline written to {args.baseline}")
        return 1 if broken else 0
    baseline = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    worse, better = compare(current, baseline)
    for line in worse:
        print(f"new gap: {line} (document it; `--list` shows where)")
    for line in better:
        print(f"fewer gaps: {line}; lower the baseline with --update-baseline")
    total = {key: sum(row[key] for row in table.values()) for key in next(iter(table.values()))}
    print(
        f"docstrings: {total['documented_members']}/{total['members']} members, "
        f"{total['documented_arguments']}/{total['arguments']} arguments documented; "
        f"{len(worse)} above the baseline, {len(broken)} broken exports"
    )
    return 1 if worse or broken else 0


if __name__ == "__main__":
    sys.exit(main())

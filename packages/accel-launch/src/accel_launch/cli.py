"""The ``accel`` command: sub-commands found through the entry-point group ``accel.commands``.

Each package registers its own sub-commands (``<name> = "<module>:add_parser"``); ``add_parser``
adds a parser to argparse's sub-parsers and sets ``func`` to the function that runs it. Parsing and
help never import torch. accel-launch's own commands are also known by name, so ``accel launch``
imports only its own module, and they still work where the package metadata is stale.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from collections.abc import Callable
    from typing import Any

GROUP = "accel.commands"

#: Sub-commands of accel-launch (also registered in its pyproject under the same group).
OWN_COMMANDS: dict[str, str] = {
    "config": "accel_launch.commands.config:add_parser",
    "env": "accel_launch.commands.env:add_parser",
    "launch": "accel_launch.commands.launch:add_parser",
    "tpu-config": "accel_launch.commands.tpu:add_parser",
    "to-fsdp2": "accel_launch.commands.to_fsdp2:add_parser",
    "verify": "accel_launch.commands.verify:add_parser",
}


def _load(target: str) -> Callable[[Any], Any]:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr or "add_parser")


def _group_entries(text: str, group: str) -> list[tuple[str, str]]:
    """``(name, target)`` pairs of one section of an ``entry_points.txt`` file."""
    entries: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            inside = line == f"[{group}]"
        elif inside and "=" in line:
            name, _, target = line.partition("=")
            entries.append((name.strip(), target.split("[")[0].strip()))
    return entries


def entry_points_of(group: str = GROUP) -> dict[str, str]:
    """Entry points of ``group`` in the distributions on ``sys.path`` (first one found wins).

    Reads the ``*.dist-info/entry_points.txt`` files directly: the same data as
    ``importlib.metadata.entry_points(group=...)`` without importing it (50 ms saved on ``accel --help``).
    """
    import os

    found: dict[str, str] = {}
    for folder in sys.path or ["."]:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in sorted(names):
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            path = os.path.join(folder or ".", name, "entry_points.txt")
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            for command, target in _group_entries(text, group):
                found.setdefault(command, target)
    return found


def discover() -> dict[str, str]:
    """Every registered sub-command, name -> ``module:function`` (entry points, then accel-launch's own)."""
    found = entry_points_of(GROUP)
    for name, target in OWN_COMMANDS.items():
        found.setdefault(name, target)
    return found


class _VersionAction(argparse.Action):
    """``--version``: the versions of the installed accel distributions, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, option: object = None
    ) -> None:
        from accel_launch.commands.env import version_line

        sys.stdout.write(version_line() + "\n")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``accel`` parser with every sub-command (or just ``only``, one of accel-launch's own)."""
    from accel_launch.launch_args import AccelArgumentParser

    parser = AccelArgumentParser(
        "accel",
        usage="accel <command> [<args>]",
        description="accel: launch and configure PyTorch training on any hardware.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_VersionAction, help="Print the installed accel distributions' versions.")
    # prog: sub-commands are "accel launch", not "accel <command> [<args>] launch" (usage and errors).
    subparsers = parser.add_subparsers(title="commands", metavar="<command>", prog="accel")
    commands = {only: OWN_COMMANDS[only]} if only is not None else discover()
    for name in sorted(commands):
        try:
            add_parser = _load(commands[name])
        except Exception as error:  # a broken plug-in must not break the other commands
            warnings.warn(f"accel: cannot load the sub-command {name!r} ({commands[name]}): {error}", stacklevel=2)
            continue
        add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``accel`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(first if first in OWN_COMMANDS else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 1
    return int(func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

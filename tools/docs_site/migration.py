"""The "Coming from Hugging Face Accelerate" tables, generated from accel's own tables at build time.

Names come from the meta-package's export tables (``accel._exports``), flags from the real ``accel``
parser, config keys from the launch-option table (``accel_launch.options``) and environment variables
from the protocol table (``accel_state.env_vars``). Accelerate and accel share these names by design,
so each table says what the Accelerate name is called in accel and where accel documents it.
"""

from __future__ import annotations

import argparse

from docs_site import reference


def _link(name: str, anchors: dict[str, tuple[str, str]]) -> str:
    """``name`` as a cross-reference to its reference entry (mkdocs-autorefs resolves the identifier)."""
    found = anchors.get(name)
    if not found:
        return f"`{name}`"
    return f"[`{name}`][{found[1]}]"


def names_table(anchors: dict[str, tuple[str, str]]) -> str:
    """Markdown: each Accelerate top-level name and utility, its accel name, and the owning distribution."""
    lines = ["| Accelerate | accel | owned by |", "| --- | --- | --- |"]
    for entry in reference.entries():
        for name in entry.public_names:
            theirs = "accelerate" + name.removeprefix("accel")
            lines.append(f"| `{theirs}` | {_link(name, anchors)} | `{entry.distribution}` |")
    return "\n".join(lines)


def accelerator_table(anchors: dict[str, tuple[str, str]]) -> str:
    """Markdown: each public member of Accelerate's ``Accelerator`` that accel's class has."""
    members = reference.accelerator_members()
    lines = ["| Accelerate | accel | kind |", "| --- | --- | --- |"]
    for member, kind in members.items():
        lines.append(f"| `accelerate.Accelerator.{member}` | {_link(f'Accelerator.{member}', anchors)} | {kind} |")
    return "\n".join(lines)


def modules_table() -> str:
    """Markdown: each documented module path and the module of accel that it is an alias of."""
    from accel import _exports

    lines = ["| Accelerate | accel | the module that runs |", "| --- | --- | --- |"]
    for path, real in sorted(_exports.MODULES.items()):
        lines.append(f"| `accelerate{path.removeprefix('accel')}` | `{path}` | `{real}` |")
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name in sorted(action.choices):
                child = action.choices[name]
                found.append((f"{prefix} {name}", child))
                found += _subcommands(child, f"{prefix} {name}")
    return found


def commands_table() -> str:
    """Markdown: each ``accelerate`` command and its flags, as ``accel`` spells them (from the parser)."""
    from accel_launch.cli import build_parser

    lines = ["| Accelerate | accel | flags |", "| --- | --- | --- |"]
    for command, parser in _subcommands(build_parser(), "accel"):
        flags = sorted(
            {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}
        )
        shown = ", ".join(f"`{flag}`" for flag in flags) or "-"
        anchor = command.replace(" ", "-")
        lines.append(f"| `accelerate{command.removeprefix('accel')}` | [`{command}`](cli.md#{anchor}) | {shown} |")
    return "\n".join(lines)


def config_keys_table() -> str:
    """Markdown: each config-file key (section, key, the launch flag that overrides it, default)."""
    from accel_launch import options

    lines = ["| config key (same in both) | `accel launch` flag | default |", "| --- | --- | --- |"]
    for option in options.OPTIONS:
        key = option.config_key
        if key is None:
            continue
        where = key if option.section == options.TOP else f"{option.section}.{key}"
        default = "-" if option.default is None else f"`{option.default!r}`"
        lines.append(f"| `{where}` | `--{option.dest}` | {default} |")
    for (section, old), current in sorted(options.LEGACY_KEYS.items()):
        where = old if section == options.TOP else f"{section}.{old}"
        lines.append(f"| `{where}` (older files) | read as `{current}` | - |")
    return "\n".join(lines)


def env_vars_table() -> str:
    """Markdown: each environment variable of the launcher protocol, its type, default and meaning."""
    from accel_state import env_vars

    lines = ["| variable (same in both) | type | default | meaning |", "| --- | --- | --- | --- |"]
    for var in env_vars.ENV_VARS.values():
        default = "-" if var.default is None else f"`{var.default!r}`"
        lines.append(f"| `{var.name}` | {var.type} | {default} | {var.help.replace('|', '/')} |")
    for name in env_vars.TORCH_DISTRIBUTED_VARS:
        lines.append(f"| `{name}` | torch | - | set by the launcher for `torch.distributed` |")
    return "\n".join(lines)


def mapping_markdown() -> str:
    """Every table of the page, with its heading; inserted where ``<!-- accelerate-mapping -->`` stands."""
    anchors = reference.anchors()
    parts = [
        (
            "Names",
            "Top-level names and utilities: `from accelerate import X` is `from accel import X`.",
            names_table(anchors),
        ),
        (
            "Accelerator methods and properties",
            "Every public member of accel's `Accelerator`.",
            accelerator_table(anchors),
        ),
        ("Module paths", "Each is the running module itself under a second name, not a copy.", modules_table()),
        ("Commands and flags", "Read from the real `accel` parser.", commands_table()),
        ("Config-file keys", "The YAML keys `accel launch` reads, from the launch-option table.", config_keys_table()),
        ("Environment variables", "The variables the launcher writes and the processes read.", env_vars_table()),
    ]
    out = []
    for title, intro, table in parts:
        out += [f"## {title}", "", intro, "", table, ""]
    return "\n".join(out)

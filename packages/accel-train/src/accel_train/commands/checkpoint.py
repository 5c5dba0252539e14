"""``accel checkpoint inspect PATH [--json] [--manifest-only]``: what a checkpoint holds, whether every file
is sound, and where it loads.

Exit status: 0 when every file checks out (with ``--manifest-only``: when no file the manifest lists is
missing, of another size than recorded or of another save), 1 when a file is missing, damaged or of
another save, 3 when a file would run code when loaded (unsafe; it wins over 1), 2 when ``PATH`` is not a
folder (and for wrong arguments, as argparse does). Parsing, help and ``--manifest-only`` never import
torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: Exit statuses of ``accel checkpoint inspect``.
EXIT_GOOD = 0
EXIT_DAMAGED = 1
EXIT_NOT_A_CHECKPOINT = 2
EXIT_UNSAFE = 3

#: The manifest's fields shown first, in this order, by the text report (the lists of entries come last).
_SHOWN_FIRST = (
    "num_processes",
    "strategy",
    "backend_settings",
    "mesh",
    "mixed_precision",
    "gradient_accumulation",
    "step",
    "data",
    "versions",
)

#: The manifest's fields the text report shows elsewhere (the save id on its own line, the record of the
#: files beside each file), not in the manifest's part.
_SHOWN_ELSEWHERE = ("save_id", "files")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``checkpoint`` (with its sub-command ``inspect``) to the ``accel`` sub-parsers."""
    parser = subparsers.add_parser(
        "checkpoint",
        help="Look into a checkpoint folder written by save_state.",
        description="Look into a checkpoint folder written by save_state.",
    )
    commands = parser.add_subparsers(title="commands", metavar="<command>", prog="accel checkpoint")
    _add_inspect(commands)
    parser.set_defaults(func=lambda args: _help(parser))
    return parser


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_NOT_A_CHECKPOINT


def _add_inspect(commands: Any) -> argparse.ArgumentParser:
    inspect = commands.add_parser(
        "inspect",
        help="Print a checkpoint's manifest, check every file, and say where it loads.",
        description="Print a checkpoint's manifest (the run that saved it) and its save id, compare every "
        "file with the manifest's record (missing, other size, written by another save, added since), check "
        "every file as load_state does (sizes, damage, pickles against the allow-lists) and say on which "
        "numbers of processes and with which backends it loads. Exit status: 0 sound, 1 a file missing, "
        "damaged or of another save, 3 a file unsafe (would run code), 2 not a folder.",
    )
    inspect.add_argument("path", help="The checkpoint folder (what accelerator.save_state wrote).")
    inspect.add_argument("--json", action="store_true", help="Print one JSON object (for scripts).")
    inspect.add_argument(
        "--manifest-only",
        "--manifest_only",
        action="store_true",
        help="Read the manifest and list the files without checking their content (no torch import; quick).",
    )
    inspect.set_defaults(func=run_inspect)
    return inspect


def exit_status(status: str) -> int:
    """The exit status for a report's ``status`` (``good``, ``unchecked``, ``damaged``, ``unsafe``)."""
    return {"unsafe": EXIT_UNSAFE, "damaged": EXIT_DAMAGED}.get(status, EXIT_GOOD)


def run_inspect(args: argparse.Namespace) -> int:
    """Inspect ``args.path``; print the report as text or JSON; return the exit status."""
    from accel_train.checkpoint.inspection import inspect_checkpoint

    try:
        report = inspect_checkpoint(args.path, check_files=not args.manifest_only)
    except NotADirectoryError as error:
        print(f"accel checkpoint inspect: {error}", file=sys.stderr)
        return EXIT_NOT_A_CHECKPOINT
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(render(report))
    return exit_status(report["status"])


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}={_value(item)}" for key, item in value.items())
    if isinstance(value, list):
        return "; ".join(_value(item) for item in value) or "none"
    return "none" if value is None else str(value)


def render(report: dict[str, Any]) -> str:
    """The text report: manifest, files, problems, where it loads, verdict."""
    lines = [f"checkpoint {report['folder']}"]
    if report.get("save_id") is not None:
        lines.append(f"save id: {report['save_id']}")
    lines.append("")
    manifest = report["manifest"]
    if manifest is None:
        lines.append("manifest: none (not written by accel's save_state, or damaged)")
    else:
        lines.append("manifest:")
        rest = sorted(key for key in manifest if key not in _SHOWN_FIRST and key not in _SHOWN_ELSEWHERE)
        for key in [*(k for k in _SHOWN_FIRST if k in manifest), *rest]:
            lines.append(f"  {key}: {_value(manifest[key])}")
    lines += ["", "files:"]
    for item in report["files"]:
        marks = ["checked"] if item["checked"] else []
        recorded = item.get("recorded")
        if recorded is not None and recorded != item["size"]:
            marks.append(f"recorded {recorded}")
        lines.append(f"  {item['size']:>12}  {item['path']}  {'  '.join(marks)}".rstrip())
    if report["problems"]:
        lines += ["", "problems:"]
        lines += [f"  {p['kind']}: {p['path']}: {p['message']}" for p in report["problems"]]
    if report.get("notes"):
        lines += ["", "notes:"]
        lines += [f"  {note['path']}: {note['message']}" for note in report["notes"]]
    where = report["loads_on"]
    counts = where["process_counts"]
    shown = counts if isinstance(counts, str) else (", ".join(map(str, counts)) or "the saved number (unknown)")
    lines += ["", "loads on:", f"  processes: {shown}", f"  backends: {', '.join(where['backends'])}"]
    lines += [f"  note: {note}" for note in where["notes"]]
    lines += ["", f"status: {report['status']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_train.commands.checkpoint inspect PATH``: the command without the ``accel`` script."""
    parser = argparse.ArgumentParser("accel")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["checkpoint", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())

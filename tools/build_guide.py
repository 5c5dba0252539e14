"""Build the documentation site (MkDocs, Material theme, mkdocstrings), quietly, and check it.

    python tools/build_guide.py                 # build into build/site, then tools/check_site.py
    python tools/build_guide.py --no-check      # build only

The site's configuration is ``mkdocs.yml``; what it generates (API reference, CLI reference,
Accelerate mapping, pictures) comes from ``tools/docs_hooks.py``. The build is strict: a warning
(a broken link or cross-reference, a docstring that names an argument the signature lacks) fails it.
MkDocs' own log is kept out of the way unless the build fails; the last line is a one-line summary.

This module also holds the pieces the hooks share: the CLI reference generated from the real
``accel`` parser (for the line ``<!-- cli-reference -->``), and the caption that the runner attributes
of a code fence (``file=``, ``processes=``, ``run-if=``) become.
"""

from __future__ import annotations

import argparse
import html
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

CLI_MARKER = "<!-- cli-reference -->"
FENCE_WITH_ATTRIBUTES = re.compile(
    r"^(?P<fence> {0,12}(?:```+|~~~+))(?P<language>[\w+-]+)[ \t]+(?P<attributes>\S.*)$", re.M
)


def _caption(match: re.Match[str]) -> str:
    """A code fence with runner attributes, as a caption line and a plain fence."""
    words = dict(word.partition("=")[::2] for word in match.group("attributes").split())
    notes = []
    if words.get("file"):
        notes.append(f"file <code>{html.escape(words['file'])}</code>")
    if words.get("processes"):
        notes.append(
            f"runs on {words['processes']} processes (<code>accel launch --num_processes {words['processes']}</code>)"
        )
    if words.get("run-if"):
        notes.append(f"runs when <code>{html.escape(words['run-if'])}</code> is available")
    indent = match.group("fence")[: len(match.group("fence")) - len(match.group("fence").lstrip())]
    caption = f'{indent}<p class="block">{"; ".join(notes)}</p>\n\n{indent}' if notes else ""
    return (
        f"{caption}{match.group('fence').lstrip()}{match.group('language')}"
        if notes
        else (f"{match.group('fence')}{match.group('language')}")
    )


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` of every sub-command under ``parser``, depth first, sorted by name."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name in sorted(action.choices):
                child = action.choices[name]
                found.append((f"{prefix} {name}", child))
                found += _subcommands(child, f"{prefix} {name}")
    return found


def cli_reference() -> str:
    """Markdown: a table of every ``accel`` sub-command, then each one's full ``--help``."""
    from accel_launch.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width: fix it
    commands = _subcommands(build_parser(), "accel")
    lines = ["| command | what it does |", "| --- | --- |"]
    for command, parser in commands:
        summary = (parser.description or "").strip().splitlines()[0] if parser.description else ""
        lines.append(f"| [`{command}`](#{command.replace(' ', '-')}) | {summary} |")
    for command, parser in commands:
        help_text = parser.format_help().rstrip().replace("```", "` ` `")
        lines += [
            "",
            f"## {command} {{ #{command.replace(' ', '-')} }}",
            "",
            "```text",
            help_text,
            "```",
        ]
    return "\n".join(lines) + "\n"


def build(config: pathlib.Path = ROOT / "mkdocs.yml", check: bool = True) -> int:
    """Build the site strictly; print MkDocs' log only on failure; then run the site check."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(config)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "100", "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"},
    )
    seconds = time.perf_counter() - start
    site = ROOT / "build" / "site"
    if result.returncode != 0:
        print(result.stdout[-20000:] + result.stderr[-20000:])
        print(f"docs: site build FAILED after {seconds:.1f} s (warnings are errors; see above)")
        return 1
    pages = len(list(site.rglob("*.html")))
    summary = f"site: {pages} pages in {site.relative_to(ROOT)} in {seconds:.1f} s"
    if check:
        import check_site

        undocumented: list[str] = []
        problems = check_site.check(site, undocumented)
        for problem in problems:
            print(f"site check: {problem}")
        summary += f"; site check: {len(problems)} problem(s), {len(undocumented)} entries awaiting a docstring"
        if problems:
            print(f"docs: {summary}")
            return 1
    print(f"docs: {summary}; open {(site / 'index.html').relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: build (and check) the site."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-check", action="store_true", help="build only, skip tools/check_site.py")
    parser.add_argument("-f", "--config", type=pathlib.Path, default=ROOT / "mkdocs.yml")
    args = parser.parse_args(argv)
    return build(args.config, check=not args.no_check)


if __name__ == "__main__":
    sys.exit(main())

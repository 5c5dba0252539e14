"""Render the user guide (docs/*.md and every package README) to HTML beside the pdoc API reference.

    python tools/build_guide.py docs docs/_build

Uses markdown2, the Markdown renderer pdoc itself depends on (the docs session installs both).
A page containing the line ``<!-- cli-reference -->`` gets, in its place, the reference of every
``accel`` sub-command generated from the real parser (so the reference cannot drift from the CLI).
The attributes that ``tools/run_doc_examples.py`` reads on a code fence (``file=``,
``processes=``, ``run-if=``) become a short caption above the block.
"""

from __future__ import annotations

import argparse
import html
import os
import pathlib
import re
import sys

CLI_MARKER = "<!-- cli-reference -->"
FENCE_WITH_ATTRIBUTES = re.compile(r"^(?P<fence>```+|~~~+)(?P<language>[\w+-]+)[ \t]+(?P<attributes>\S.*)$", re.M)

#: Order of the guide's pages in the navigation; pages not listed follow, alphabetically.
ORDER = [
    "index",
    "quicktour",
    "migrating",
    "launching",
    "accumulation-precision",
    "checkpoints",
    "big-models",
    "trackers",
    "fsdp",
    "deepspeed",
    "quantization",
    "faults",
    "state",
    "troubleshooting",
    "compatibility",
    "cli",
    "architecture",
]

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{max-width:60rem;margin:2rem auto;font-family:sans-serif;line-height:1.5}}pre{{background:#f4f4f4;padding:.8rem;overflow:auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ddd;padding:.2rem .5rem}}p.block{{margin:.8rem 0 -.6rem;font-size:.85rem;color:#555}}</style>
</head><body><p><a href="index.html">guide</a> · <a href="api/index.html">API reference</a></p>{body}</body></html>"""


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
    caption = f'<p class="block">{"; ".join(notes)}</p>\n\n' if notes else ""
    return f"{caption}{match.group('fence')}{match.group('language')}"


def render(markdown_text: str) -> str:
    """HTML of one Markdown page (fenced code, tables, header ids)."""
    import markdown2  # installed with pdoc by the docs session

    markdown_text = FENCE_WITH_ATTRIBUTES.sub(_caption, markdown_text)
    return str(markdown2.markdown(markdown_text, extras=["fenced-code-blocks", "tables", "header-ids"]))


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
            f'<h2 id="{command.replace(" ", "-")}">{html.escape(command)}</h2>',
            "",
            "```text",
            help_text,
            "```",
        ]
    return "\n".join(lines) + "\n"


def _rank(name: str) -> tuple[int, str]:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def build(docs: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """Write one HTML page per guide page and package README; returns the pages written."""
    root = docs.parent
    out.mkdir(parents=True, exist_ok=True)
    guide = sorted(docs.glob("*.md"), key=lambda path: _rank(path.stem))
    readmes = sorted((root / "packages").glob("*/README.md"))
    written = []
    guide_links, package_links = [], []
    for source in guide + readmes:
        name = source.stem if source.parent == docs else source.parent.name
        target = out / f"{name}.html"
        text = source.read_text()
        if CLI_MARKER in text:
            text = text.replace(CLI_MARKER, cli_reference())
        title = next((line.lstrip("# ") for line in text.splitlines() if line.startswith("#")), name)
        target.write_text(PAGE.format(title=html.escape(title), body=render(text)))
        written.append(target)
        if name != "index":
            link = f'<li><a href="{name}.html">{html.escape(title)}</a></li>'
            (guide_links if source.parent == docs else package_links).append(link)
    index = out / "index.html"
    intro = render((docs / "index.md").read_text()) if (docs / "index.md").exists() else ""
    body = (
        intro
        + "<h2>Pages</h2><ul>"
        + "".join(guide_links)
        + "</ul><h2>The distributions</h2><ul>"
        + "".join(package_links)
        + '</ul><p><a href="api/index.html">API reference</a> (generated from the docstrings)</p>'
    )
    index.write_text(PAGE.format(title="accel user guide", body=body))
    return written


if __name__ == "__main__":
    pages = build(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    print(f"built {len(pages)} guide pages into {sys.argv[2]}")

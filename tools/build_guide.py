"""Render the user guide (docs/*.md and every package README) to HTML beside the pdoc API reference.

    python tools/build_guide.py docs docs/_build

Uses markdown2, the Markdown renderer pdoc itself depends on (the docs session installs both).
"""

from __future__ import annotations

import html
import pathlib
import sys

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{max-width:60rem;margin:2rem auto;font-family:sans-serif;line-height:1.5}}pre{{background:#f4f4f4;padding:.8rem;overflow:auto}}</style>
</head><body><p><a href="index.html">guide</a> · <a href="api/index.html">API reference</a></p>{body}</body></html>"""


def render(markdown_text: str) -> str:
    import markdown2  # installed with pdoc by the docs session

    return str(markdown2.markdown(markdown_text, extras=["fenced-code-blocks", "tables", "header-ids"]))


def build(docs: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """Write one HTML page per guide page and package README; returns the pages written."""
    root = docs.parent
    out.mkdir(parents=True, exist_ok=True)
    sources = sorted(docs.glob("*.md")) + sorted((root / "packages").glob("*/README.md"))
    written = []
    links = []
    for source in sources:
        name = source.stem if source.parent == docs else source.parent.name
        target = out / f"{name}.html"
        text = source.read_text()
        title = next((line.lstrip("# ") for line in text.splitlines() if line.startswith("#")), name)
        target.write_text(PAGE.format(title=html.escape(title), body=render(text)))
        written.append(target)
        if name != "index":
            links.append(f'<li><a href="{name}.html">{html.escape(title)}</a></li>')
    index = out / "index.html"
    intro = render((docs / "index.md").read_text()) if (docs / "index.md").exists() else ""
    index.write_text(PAGE.format(title="accel", body=intro + "<h2>Pages</h2><ul>" + "".join(links) + "</ul>"))
    return written


if __name__ == "__main__":
    pages = build(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    print(f"built {len(pages)} guide pages into {sys.argv[2]}")

"""Check the built site: every public name has an anchor with a description and is in the search index.

    python tools/check_site.py [build/site]

The public names are read at run time (``tools/docs_site/reference.py``): every name ``accel`` and
``accel.utils`` export and every public method and property of ``Accelerator``. For each, the page the
reference puts it on must have an element with its anchor id, that entry must carry a description (its
docstring rendered), and the search index must hold an entry for that anchor. An entry whose object has
no docstring at all is listed apart: that gap belongs to the docstring ratchet
(``tools/check_docstrings.py`` and its baseline), which fails when such gaps grow. No page may contain
the text ``<object object`` (a default value rendered as Python's repr of a sentinel).

Search must work from a copy opened from disk: the index is also there as ``search/search_index.js``
(the offline plugin's), the local worker shim is there, and no page loads a script from the network.
For tools: every page has its Markdown twin (``page.md`` beside ``page.html``), ``llms.txt`` links every
twin, ``llms-full.txt`` holds every twin, and every guide page whose examples CI runs carries the note
that says so, with the versions of the build.
Prints the problems and exits 1 if there are any.
"""

from __future__ import annotations

import html.parser
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import run_doc_examples  # noqa: E402
from docs_site import examples_note, llms, reference  # noqa: E402

#: The local script that runs the search worker on a file:// page (mkdocs.yml, extra.polyfills).
WORKER_SHIM = "javascripts/iframe-worker.js"
#: Built pages that are not pages of the guide (the theme's "not found" page).
NOT_PAGES = {"404.html"}
REMOTE_SCRIPT = re.compile(r"<script[^>]*\ssrc=\"(?P<src>(?:https?:)?//[^\"]+)\"")


class _Entries(html.parser.HTMLParser):
    """Collects the mkdocstrings entries of a page: anchor id -> text of its description block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.descriptions: dict[str, str] = {}
        self._stack: list[tuple[str, str | None]] = []  # (tag, id of the entry whose description it is)
        self._last_heading: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
            if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
                self._last_heading = values["id"]
        classes = (values.get("class") or "").split()
        owner = self._stack[-1][1] if self._stack else None
        if "doc-contents" in classes and self._last_heading:
            owner = self._last_heading
            self.descriptions.setdefault(owner, "")
        if tag not in ("br", "img", "hr", "input", "meta", "link", "col", "wbr"):
            self._stack.append((tag, owner))

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            open_tag, _ = self._stack.pop()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        owner = self._stack[-1][1] if self._stack else None
        if owner is not None and data.strip():
            self.descriptions[owner] = self.descriptions.get(owner, "") + data


def _page_entries(site: pathlib.Path, page: str) -> _Entries:
    parser = _Entries()
    parser.feed((site / page.replace(".md", ".html")).read_text(encoding="utf-8"))
    return parser


def site_pages(site: pathlib.Path) -> list[str]:
    """Every built page of the guide, as a path from the site root (``reference/accel-data.html``)."""
    pages = (page.relative_to(site).as_posix() for page in site.rglob("*.html"))
    return sorted(page for page in pages if page not in NOT_PAGES and not page.startswith("assets/"))


def check_offline_search(site: pathlib.Path) -> list[str]:
    """Problems keeping search from working when the site is opened from disk (empty when none)."""
    problems = []
    script = site / "search" / "search_index.js"
    if not script.exists():
        problems.append("no search/search_index.js: search cannot load from file:// (is the offline plugin on?)")
    elif not script.read_text(encoding="utf-8").startswith("var __index = "):
        problems.append("search/search_index.js does not define __index (the theme reads it from there)")
    if not (site / WORKER_SHIM).exists():
        problems.append(f"no {WORKER_SHIM}: the search worker cannot start from file://")
    for page in site_pages(site):
        text = (site / page).read_text(encoding="utf-8")
        for found in REMOTE_SCRIPT.finditer(text):
            problems.append(
                f"{page} loads a script from the network ({found.group('src')}); a copy opened offline cannot"
            )
        if WORKER_SHIM not in text:
            problems.append(f"{page} does not load {WORKER_SHIM} (mkdocs.yml extra.polyfills)")
    return problems


def check_tool_files(site: pathlib.Path, pages: list[str] | None = None) -> list[str]:
    """Problems of the files for tools: twins, llms.txt, llms-full.txt (empty when none)."""
    pages = site_pages(site) if pages is None else pages
    problems = []
    index, full = site / "llms.txt", site / "llms-full.txt"
    listed: set[str] = set()
    if not index.exists():
        problems.append("no llms.txt at the site's root")
    else:
        text = index.read_text(encoding="utf-8")
        if not text.startswith("# ") or "\n> " not in text:
            problems.append("llms.txt does not open with an H1 title and a blockquote summary")
        listed = llms.linked_files(text)
    full_text = full.read_text(encoding="utf-8") if full.exists() else None
    if full_text is None:
        problems.append("no llms-full.txt at the site's root")
    for page in pages:
        twin = llms.twin_path(page)
        if not (site / twin).exists():
            problems.append(f"{page}: no Markdown twin {twin}")
        if index.exists() and twin not in listed:
            problems.append(f"{page}: llms.txt does not list its twin {twin}")
        if full_text is not None and f"<!-- {twin} -->" not in full_text:
            problems.append(f"{page}: llms-full.txt does not hold its twin {twin}")
    return problems


def check_examples_notes(site: pathlib.Path, guide_pages: list[pathlib.Path] | None = None) -> list[str]:
    """Every guide page whose examples CI runs must carry the note (HTML and twin); empty when all do."""
    guide_pages = run_doc_examples.default_pages() if guide_pages is None else guide_pages
    problems = []
    for source in guide_pages:
        count = examples_note.count_examples(run_doc_examples.extract_blocks(source))
        built = site / f"{source.stem}.html"
        if not count.runnable or not built.exists():
            continue
        if f"admonition note {examples_note.NOTE_CLASS}" not in built.read_text(encoding="utf-8"):
            problems.append(f"{built.name}: {count.runnable} examples run in CI, but the page does not say so")
        twin = site / llms.twin_path(built.name)
        if twin.exists() and "**Examples run in CI.**" not in twin.read_text(encoding="utf-8"):
            problems.append(f"{twin.name}: {count.runnable} examples run in CI, but the twin does not say so")
    return problems


def check(site: pathlib.Path, undocumented: list[str] | None = None) -> list[str]:
    """Every problem of the built site at ``site`` (empty when it passes).

    Args:
        site: The folder MkDocs built.
        undocumented: When given, receives the public names whose entry has no description because
            the object has no docstring yet: those are gaps that ``tools/check_docstrings.py`` counts
            against its baseline, not rendering problems.

    Returns:
        One line per problem.
    """
    undocumented = [] if undocumented is None else undocumented
    problems: list[str] = []
    for page in sorted(site.rglob("*.html")):
        if "<object object" in page.read_text(encoding="utf-8"):
            problems.append(f"{page.relative_to(site)} contains '<object object' (a default rendered as a repr)")
    index_file = site / "search" / "search_index.json"
    locations = set()
    if index_file.exists():
        locations = {doc["location"] for doc in json.loads(index_file.read_text(encoding="utf-8"))["docs"]}
    else:
        problems.append("no search index (search/search_index.json)")
    parsed: dict[str, _Entries] = {}
    for name, (page, anchor) in sorted(reference.anchors().items()):
        if not (site / page.replace(".md", ".html")).exists():
            problems.append(f"{name}: page {page} was not built")
            continue
        if page not in parsed:
            parsed[page] = _page_entries(site, page)
        entries = parsed[page]
        if anchor not in entries.ids:
            problems.append(f"{name}: no anchor #{anchor} on {page}")
            continue
        if not entries.descriptions.get(anchor, "").strip():
            if reference.has_own_docstring(name):
                problems.append(f"{name}: the entry #{anchor} on {page} has no description")
            else:
                undocumented.append(name)
        if locations and f"{page.replace('.md', '.html')}#{anchor}" not in locations:
            problems.append(f"{name}: #{anchor} is not in the search index")
    problems += check_offline_search(site)
    problems += check_tool_files(site)
    problems += check_examples_notes(site)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check the site folder given (default build/site)."""
    args = argv if argv is not None else sys.argv[1:]
    site = pathlib.Path(args[0]) if args else ROOT / "build" / "site"
    undocumented: list[str] = []
    problems = check(site, undocumented)
    for problem in problems:
        print(problem)
    print(
        f"site check: {len(reference.anchors())} public names, {len(problems)} problem(s), "
        f"{len(undocumented)} without a docstring yet (counted by tools/check_docstrings.py)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

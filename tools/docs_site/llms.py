"""The site for tools: a Markdown twin of every page, ``llms.txt`` and ``llms-full.txt``.

A program reading the documentation (a language model, a search tool, a script) does better with
Markdown than with themed HTML. So beside every built page ``page.html`` the site has ``page.md``: the
page's Markdown as the build filled it in (generated sections written out, the API reference expanded
from its directives by :mod:`docs_site.api_markdown`), with the site-only syntax removed. At the site's
root, ``llms.txt`` follows the llmstxt.org format (an H1 title, a blockquote summary, then one
section per part of the navigation with a Markdown link to each page's twin and a one-line
description), and ``llms-full.txt`` holds the twins themselves, one after the other in navigation order.

Everything here is a pure function of text; ``tools/docs_hooks.py`` collects the pages during the build
and writes the files.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Iterable

#: How long a page's one-line description may be before it is cut (at a word, with an ellipsis).
DESCRIPTION_LIMIT = 200

FENCE = re.compile(r"^\s{0,12}(`{3,}|~{3,})")
HEADING_ATTRIBUTES = re.compile(r"^(?P<heading>#{1,6} .*?)[ \t]*\{[^{}]*\}[ \t]*$", re.M)
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]*)(?:\s+\"[^\"]*\")?\)")
REFERENCE_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\[[^\]]*\]")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
#: Words whose full stop does not end a sentence.
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")
MARKDOWN_LINK_TARGET = re.compile(r"\]\((?P<target>[^)\s#]+)(?:#[^)\s]*)?\)")


@dataclasses.dataclass
class Page:
    """One page of the site as the tools see it.

    Attributes:
        title: The title the navigation shows.
        twin: The twin's path from the site root (``reference/accel-data.md``).
        markdown: The twin's text.
        section: The navigation section it is listed under (``Guide``); top-level pages have the
            site's first section, :data:`TOP_SECTION`.
        description: Its one line in ``llms.txt``; :func:`describe` of ``markdown`` when empty (give
            it when a note placed above the page's first paragraph would be read instead).
    """

    title: str
    twin: str
    markdown: str
    section: str
    description: str = ""


#: The llms.txt section of pages the navigation lists outside any section (the home page).
TOP_SECTION = "Start"


def twin_path(html_path: str) -> str:
    """Where the twin of a built page lives: ``page.html`` -> ``page.md``, ``dir/index.html`` -> ``dir/index.md``.

    Raises:
        ValueError: ``html_path`` is not an ``.html`` page.
    """
    if not html_path.endswith(".html"):
        raise ValueError(f"a page's built path ends with .html (the twin replaces that by .md); got {html_path!r}")
    return html_path[: -len(".html")] + ".md"


def fenced_lines(markdown: str) -> Iterable[tuple[bool, str]]:
    """``(in_code, line)`` for every line (a fence's own lines count as code), so that a rewrite can leave
    code blocks as they are. Shared by the twins and the site's inline-code links (docs_hooks)."""
    fence: str | None = None
    for line in markdown.splitlines(keepends=True):
        match = FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker
                yield True, line
                continue
            if marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip()[len(marker) :].strip():
                fence = None
                yield True, line
                continue
        yield fence is not None, line


INLINE_CODE_HTML = re.compile(r"<code>(?P<code>.*?)</code>")
PARAGRAPH_TAG = re.compile(r"</?p(?:\s[^>]*)?>")


def plain_markdown(markdown: str) -> str:
    """Site-only syntax written as plain Markdown, code blocks untouched.

    Headings lose their attribute lists (``## accel launch { #accel-launch }`` -> ``## accel launch``);
    the small inline HTML the generators write (``<p class=...>``, ``<code>x</code>``) becomes text and
    backticks.
    """
    out = []
    for in_code, line in fenced_lines(markdown):
        if not in_code:
            line = HEADING_ATTRIBUTES.sub(r"\g<heading>", line)
            line = INLINE_CODE_HTML.sub(lambda m: f"`{html.unescape(m.group('code'))}`", line)
            line = PARAGRAPH_TAG.sub("", line)
        out.append(line)
    return "".join(out)


def insert_after_title(markdown: str, block: str) -> str:
    """``block`` placed after the page's first ``# Title`` line (at the top when it has none)."""
    lines = markdown.splitlines(keepends=True)
    for index, (in_code, line) in enumerate(fenced_lines(markdown)):
        if not in_code and line.startswith("# "):
            return "".join(lines[: index + 1]) + "\n" + block.rstrip("\n") + "\n" + "".join(lines[index + 1 :])
    return block.rstrip("\n") + "\n\n" + markdown


def _without_emphasis(text: str) -> str:
    """``*``/``_`` emphasis marks dropped outside code spans (a cut sentence would leave one open)."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):
        parts[index] = re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", parts[index])
    return "`".join(parts)


def describe(markdown: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """A page's one-line description: the first sentence of its first paragraph of prose.

    Headings, code blocks, tables, admonitions, HTML and markers are passed over; links keep their
    text. Returns "" for a page with no prose.
    """
    paragraph: list[str] = []
    for in_code, line in fenced_lines(markdown):
        text = line.strip()
        if in_code or not text:
            if paragraph:
                break
            continue
        if not paragraph and (text.startswith(("#", "|", "!!!", "???", "<", ":::", "- ", "* ", "![")) or text == "---"):
            continue
        paragraph.append(text.removeprefix("> "))
    if not paragraph:
        return ""
    text = " ".join(paragraph)
    text = LINK.sub(lambda m: m.group("text"), text)
    text = REFERENCE_LINK.sub(lambda m: m.group("text"), text)
    text = _without_emphasis(text)
    sentence = text
    for end in SENTENCE_END.finditer(text):
        if not text[: end.start()].lower().endswith(ABBREVIATIONS):
            sentence = text[: end.start()]
            break
    sentence = sentence.strip()
    if len(sentence) > limit:
        cut = sentence[: limit - 1].rsplit(" ", 1)[0]
        sentence = cut.rstrip(",;:") + "…"
    return sentence


def llms_txt(title: str, summary: str, pages: list[Page]) -> str:
    """The ``llms.txt`` of the site: title, summary, then each navigation section's pages, linked.

    The links are relative to the site's root, where ``llms.txt`` is, so they hold wherever the site
    is served from, or opened from disk.

    Args:
        title: The site's name (the H1).
        summary: One or two sentences on what it documents (the blockquote).
        pages: Every page, in navigation order.

    Raises:
        ValueError: ``title`` is empty.
    """
    if not title.strip():
        raise ValueError("llms.txt needs a title (the site_name of mkdocs.yml)")
    lines = [f"# {title.strip()}", ""]
    if summary.strip():
        lines += [f"> {' '.join(summary.split())}", ""]
    lines += [
        "Every page below is the Markdown twin of a page of this site (`page.md` beside `page.html`); "
        "`llms-full.txt` holds them all in one file, in this order.",
        "",
    ]
    section: str | None = None
    for page in pages:
        if page.section != section:
            section = page.section
            lines += ["", f"## {section}", ""]
        description = page.description or describe(page.markdown)
        link = f"- [{page.title}]({page.twin})"
        lines.append(f"{link}: {description}" if description else link)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n"


def llms_full_txt(title: str, summary: str, pages: list[Page]) -> str:
    """Every page's twin in navigation order, each after a comment naming its file."""
    parts = [f"# {title.strip()}\n\n> {' '.join(summary.split())}\n" if summary.strip() else f"# {title.strip()}\n"]
    for page in pages:
        parts.append(f"<!-- {page.twin} -->\n\n{page.markdown.strip()}\n")
    return "\n---\n\n".join(parts)


def linked_files(text: str) -> set[str]:
    """The targets of the Markdown links of ``text`` (anchors dropped), as written."""
    return {match.group("target") for match in MARKDOWN_LINK_TARGET.finditer(text)}

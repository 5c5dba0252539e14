"""MkDocs hooks of the documentation site (``hooks:`` in ``mkdocs.yml``): the generated parts.

- ``on_config``: every ``docs/*.md`` page missing from the ``nav`` of ``mkdocs.yml`` is appended to
  its "Guide" section, so a new page shows in the sidebar before anyone places it;
- ``on_files``: the API reference pages (``tools/docs_site/reference.py``), the package READMEs, and
  the pictures (layer and flow diagrams, benchmark plots) are added as generated files;
- ``on_page_markdown``: links to ``page.html`` (the old guide's form) become ``page.md``; the markers ``<!-- cli-reference -->``, ``<!-- accelerate-mapping -->`` and
  ``<!-- benchmark-plots -->`` are replaced by what they name; a page whose examples
  ``tools/run_doc_examples.py`` runs gets a note saying so, with the accel and torch versions of the
  build (``tools/docs_site/examples_note.py``); the page's Markdown twin is kept (see below); the
  attributes of runnable code fences (``processes=2``, ``run-if=...``, ``file=...``) become a caption;
  and inline code naming a public object (`` `init_empty_weights` ``, `` `accelerator.save_state()` ``)
  links to its reference entry;
- ``on_nav`` / ``on_post_build``: every page's Markdown twin is written beside it (``page.md`` beside
  ``page.html``), and ``llms.txt`` and ``llms-full.txt`` at the site's root, in navigation order
  (``tools/docs_site/llms.py``; the reference pages' directives written out by
  ``tools/docs_site/api_markdown.py``).
"""

from __future__ import annotations

import functools
import pathlib
import re
import sys
from typing import Any

TOOLS = pathlib.Path(__file__).resolve().parent
ROOT = TOOLS.parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import build_guide  # noqa: E402
import run_doc_examples  # noqa: E402
from docs_site import api_markdown, examples_note, llms, migration, pictures, reference  # noqa: E402

MAPPING_MARKER = "<!-- accelerate-mapping -->"
BENCH_MARKER = "<!-- benchmark-plots -->"
INLINE_CODE = re.compile(r"(?<![`\[])`(?P<code>[A-Za-z_][\w.]*)(?P<call>\(\))?`(?![`\]])")

#: What this build has seen: src_uri -> (page, its Markdown twin, its description); the navigation.
_TWINS: dict[str, tuple[Any, str, str]] = {}
_NAV: list[Any] = []


@functools.cache
def _anchors() -> dict[str, tuple[str, str]]:
    return reference.anchors()


@functools.cache
def _link_targets() -> dict[str, str]:
    """What inline code may name -> the reference identifier it links to."""
    targets: dict[str, str] = {}
    members = reference.accelerator_members()
    for name, (_, identifier) in _anchors().items():
        targets[name] = identifier
        if name.startswith("Accelerator."):
            member = name.split(".", 1)[1]
            targets[f"accelerator.{member}"] = identifier
            if "_" in member and member in members:
                targets.setdefault(member, identifier)  # `save_state`: one word alone is too ambiguous
        else:
            short = name.rsplit(".", 1)[1]
            targets.setdefault(short, identifier)
    return targets


def on_config(config: Any) -> Any:
    """Append the guide pages the nav does not list to its "Guide" section."""
    _TWINS.clear()
    _NAV.clear()
    nav = config["nav"] or []
    listed: set[str] = set()

    def walk(items: Any) -> None:
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                walk(value)
            elif isinstance(value, str):
                listed.add(value)

    walk(nav)
    docs_dir = pathlib.Path(config["docs_dir"])
    missing = sorted(p.name for p in docs_dir.glob("*.md") if p.name not in listed)
    for item in nav:
        if isinstance(item, dict) and "Guide" in item:
            item["Guide"].extend(missing)
            break
    return config


def generated_pages() -> dict[str, str]:
    """Site path -> Markdown of every generated page (reference and package READMEs)."""
    pages = reference.pages()
    for readme in sorted((ROOT / "packages").glob("*/README.md")):
        pages[f"packages/{readme.parent.name}.md"] = readme.read_text(encoding="utf-8")
    return pages


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and pictures to the site's files."""
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    images = {"images/layers.svg": pictures.layers_svg().encode(), "images/flow.svg": pictures.flow_svg().encode()}
    images.update(_bench()[1])
    for path, data in images.items():
        files.append(File.generated(config, path, content=data))
    return files


@functools.cache
def _bench() -> tuple[str, dict[str, bytes]]:
    return pictures.benchmark_files()


def captions(markdown: str) -> str:
    """Runner attributes of code fences (``processes=2`` ...) as a caption line above a plain fence."""
    return build_guide.FENCE_WITH_ATTRIBUTES.sub(build_guide._caption, markdown)


def link_inline_code(markdown: str) -> str:
    """Inline code naming a public object becomes a cross-reference to its entry (not in code blocks)."""
    targets = _link_targets()
    out: list[str] = []
    for in_code, line in llms.fenced_lines(markdown):
        if in_code or line.lstrip().startswith("#") or "<h" in line:
            out.append(line)
            continue

        def replace(found: re.Match[str]) -> str:
            identifier = targets.get(found.group("code"))
            if identifier is None:
                return found.group(0)
            return f"[{found.group(0)}][{identifier}]"

        out.append(INLINE_CODE.sub(replace, line))
    return "".join(out)


HTML_LINK = re.compile(r"\]\((?P<name>[A-Za-z0-9_-]+)\.html(?P<anchor>#[^)\s]*)?\)")


def md_links(markdown: str, docs_dir: pathlib.Path) -> str:
    """Links written for the old hand-built guide (``](launching.html)``, ``](accel-data.html)``)
    pointed at its HTML pages; point them at the Markdown source MkDocs checks and links."""

    def replace(found: re.Match[str]) -> str:
        name, anchor = found.group("name"), found.group("anchor") or ""
        if (docs_dir / f"{name}.md").exists():
            return f"]({name}.md{anchor})"
        if (ROOT / "packages" / name / "README.md").exists():
            return f"](packages/{name}.md{anchor})"
        return found.group(0)

    return HTML_LINK.sub(replace, markdown)


@functools.cache
def _versions() -> dict[str, str]:
    return examples_note.build_versions()


@functools.cache
def _resolver() -> Any:
    packages = [distribution.replace("-", "_") for distribution in reference.DISTRIBUTIONS] + ["accel"]
    return api_markdown.griffe_resolver(packages)


def examples_count(page_path: pathlib.Path) -> examples_note.ExampleCount | None:
    """How many examples of a page CI runs, or None when the runner does not run the page (or none of it)."""
    if not examples_note.runs_examples(page_path, run_doc_examples.default_pages()):
        return None
    count = examples_note.count_examples(run_doc_examples.extract_blocks(page_path))
    return count if count.runnable else None


def twin_markdown(markdown: str) -> str:
    """A page's filled-in Markdown as its twin shows it: directives written out, plain Markdown."""
    if "\n::: " in f"\n{markdown}":
        markdown = api_markdown.expand_directives(markdown, _resolver())
    return llms.plain_markdown(markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the markers, add the examples note, keep the twin, caption the runnable fences and link
    inline code to the reference."""
    if build_guide.CLI_MARKER in markdown:
        markdown = markdown.replace(build_guide.CLI_MARKER, build_guide.cli_reference())
    if MAPPING_MARKER in markdown:
        markdown = markdown.replace(MAPPING_MARKER, migration.mapping_markdown())
    if BENCH_MARKER in markdown:
        markdown = markdown.replace(BENCH_MARKER, _bench()[0])
    if page.file.src_uri.count("/") == 0:
        markdown = md_links(markdown, pathlib.Path(config["docs_dir"]))
    twin = twin_markdown(markdown)
    description = llms.describe(twin)  # before the note, which would otherwise be the first paragraph
    count = examples_count(pathlib.Path(config["docs_dir"]) / page.file.src_uri)
    if count is not None:
        twin = llms.insert_after_title(twin, examples_note.quote(count, _versions()))
        markdown = llms.insert_after_title(markdown, examples_note.admonition(count, _versions()))
    _TWINS[page.file.src_uri] = (page, twin, description)
    markdown = captions(markdown)
    if not page.file.src_uri.startswith("reference/"):
        markdown = link_inline_code(markdown)
    return markdown


def on_nav(nav: Any, config: Any, files: Any) -> Any:
    """Keep the navigation: llms.txt lists the pages in its order and under its sections."""
    _NAV[:] = [nav]
    return nav


def nav_sections(items: list[Any], section: str = llms.TOP_SECTION) -> list[tuple[str, Any]]:
    """``(section title, page)`` for every page of a MkDocs navigation, in order; a page inside nested
    sections is listed under their titles joined by " / "."""
    found: list[tuple[str, Any]] = []
    for item in items:
        children = getattr(item, "children", None)
        if children is not None and not getattr(item, "is_page", False):
            title = item.title if section == llms.TOP_SECTION else f"{section} / {item.title}"
            found += nav_sections(children, title)
        elif getattr(item, "is_page", False):
            found.append((section, item))
    return found


def on_post_build(config: Any) -> None:
    """Write every page's twin beside it, then llms.txt and llms-full.txt at the site's root."""
    site = pathlib.Path(config["site_dir"])
    listed = nav_sections(_NAV[0].items) if _NAV else []
    seen = {page.file.src_uri for _, page in listed}
    listed += [("Other pages", page) for uri, (page, _, _) in sorted(_TWINS.items()) if uri not in seen]
    pages = []
    for section, page in listed:
        if page.file.src_uri not in _TWINS:
            continue
        twin = llms.twin_path(page.file.dest_uri)
        _, text, description = _TWINS[page.file.src_uri]
        (site / twin).parent.mkdir(parents=True, exist_ok=True)
        (site / twin).write_text(text, encoding="utf-8")
        pages.append(llms.Page(page.title or twin, twin, text, section, description))
    title, summary = config["site_name"], config.get("site_description") or ""
    (site / "llms.txt").write_text(llms.llms_txt(title, summary, pages), encoding="utf-8")
    (site / "llms-full.txt").write_text(llms.llms_full_txt(title, summary, pages), encoding="utf-8")

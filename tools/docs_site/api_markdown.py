"""The API reference as plain Markdown, for the Markdown twins of the reference pages.

On the site, a reference page is a list of mkdocstrings directives (``::: accel_train.accelerator.Accelerator``
with an indented ``options:`` block) that become HTML at build time; the Markdown source alone says
nothing to a reader or a tool. :func:`expand_directives` replaces each directive by what the HTML page
shows, written as Markdown: a heading, the signature in a ``python`` block, the docstring's text and
its sections (arguments, returns, raises...) as lists, then the members. It reads the code the way
mkdocstrings does (griffe, static analysis of the sources, Google-style docstrings), so the twin and
the HTML page agree, defaults included (a sentinel default shows its name, not an ``object`` repr).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator
from typing import Any

DIRECTIVE = re.compile(r"^::: (?P<identifier>[\w.]+)\s*$")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No log records below ERROR while griffe reads the code again: the HTML build has already reported
    what it has to say (inside MkDocs, griffe's logger is an adapter that a level cannot be set on)."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


@functools.cache
def _loader(packages: tuple[str, ...]) -> Any:
    import griffe

    loader = griffe.GriffeLoader(docstring_parser=griffe.Parser.google)
    with _quiet():
        for package in packages:
            loader.load(package)
        loader.resolve_aliases(implicit=False, external=None)
    return loader


def griffe_resolver(packages: Iterable[str]) -> Callable[[str], Any]:
    """A function from a dotted path (``accel_state.state.PartialState``) to its griffe object, with
    ``packages`` (top-level module names) loaded once from ``sys.path``."""
    loader = _loader(tuple(packages))

    def resolve(identifier: str) -> Any:
        try:
            return loader.modules_collection.get_member(identifier)
        except (KeyError, ValueError) as error:
            raise LookupError(
                f"the reference names {identifier!r}, which is not in the packages loaded ({', '.join(packages)})"
            ) from error

    return resolve


def _indented(line: str) -> bool:
    return line.startswith((" ", "\t")) and bool(line.strip())


def _blank_inside(lines: list[str], index: int) -> bool:
    """A blank line with more of the indented options block after it."""
    return not lines[index].strip() and index + 1 < len(lines) and _indented(lines[index + 1])


def split_directives(markdown: str) -> list[str | tuple[str, dict[str, Any]]]:
    """The page as Markdown text pieces and ``(identifier, options)`` for each ``:::`` directive.

    The options are the directive's indented block read as YAML (``options:`` in it), as mkdocstrings
    reads them; a directive inside a fenced code block is text, not a directive.
    """
    pieces: list[str | tuple[str, dict[str, Any]]] = []
    lines = markdown.splitlines(keepends=True)
    text: list[str] = []
    fence: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = marker if fence is None else (None if stripped.startswith(fence) else fence)
        found = DIRECTIVE.match(line) if fence is None else None
        if not found:
            text.append(line)
            index += 1
            continue
        index += 1
        block: list[str] = []
        while index < len(lines) and (_indented(lines[index]) or _blank_inside(lines, index)):
            block.append(lines[index])
            index += 1
        import yaml  # the site build's; imported here so that the module loads without it

        try:
            parsed = yaml.safe_load(textwrap.dedent("".join(block))) if block else None
        except yaml.YAMLError as error:
            raise ValueError(f"the options of '::: {found.group('identifier')}' are not valid YAML: {error}") from None
        if parsed is not None and not isinstance(parsed, dict):
            raise ValueError(
                f"the options of '::: {found.group('identifier')}' must be a mapping (options: ...), got {parsed!r}"
            )
        if text:
            pieces.append("".join(text))
            text = []
        pieces.append((found.group("identifier"), dict((parsed or {}).get("options") or {})))
    if text:
        pieces.append("".join(text))
    return pieces


def expand_directives(markdown: str, resolve: Callable[[str], Any], heading_level: int = 2) -> str:
    """``markdown`` with every ``:::`` directive replaced by the Markdown of the object it names."""
    out = []
    for piece in split_directives(markdown):
        if isinstance(piece, str):
            out.append(piece)
            continue
        identifier, options = piece
        level = int(options.get("heading_level", heading_level))
        out.append(object_markdown(resolve(identifier), options, level).rstrip("\n") + "\n")
    return "".join(out)


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def _indent_rest(text: str) -> str:
    """Continuation lines of a list item indented under it."""
    first, _, rest = text.strip().partition("\n")
    return first + ("\n" + textwrap.indent(rest, "  ") if rest else "")


def signature(obj: Any) -> str:
    """The one-line signature of a function or class (its ``__init__``), or ``name: type = value``."""
    if obj.is_function or obj.is_class:
        try:
            return obj.signature()
        except (AttributeError, ValueError):
            return f"{obj.name}(...)"
    text = obj.name
    if getattr(obj, "annotation", None) is not None:
        text += f": {obj.annotation}"
    if getattr(obj, "value", None) is not None:
        text += f" = {obj.value}"
    return text


def _item(item: Any, with_default: bool) -> str:
    head = []
    name = getattr(item, "name", "") or ""
    if name:
        head.append(_code(name))
    details = []
    if item.annotation:
        details.append(_code(str(item.annotation)))
    if with_default and getattr(item, "default", None) is not None:
        details.append(f"default {_code(str(item.default))}")
    if details:
        head.append(f"({', '.join(details)})" if name else ", ".join(details))
    description = (item.description or "").strip()
    line = " ".join(head)
    return f"- {line}: {_indent_rest(description)}" if description else f"- {line}"


def docstring_markdown(obj: Any) -> str:
    """The docstring of ``obj``: its text as written, its sections as titled lists (empty when none)."""
    docstring = obj.docstring
    if docstring is None and obj.is_class and "__init__" in obj.members:
        docstring = obj.members["__init__"].docstring  # merge_init_into_class: the site shows __init__'s
    if docstring is None:
        return ""
    import griffe

    with _quiet():
        sections = docstring.parse(griffe.Parser.google, warnings=False)
    parts = []
    for section in sections:
        kind = section.kind.value
        if kind == "text":
            parts.append(section.value.strip())
        elif kind == "admonition":
            title = section.title or section.value.annotation or "Note"
            parts.append(f"**{title.capitalize()}:** {section.value.description.strip()}")
        elif kind == "examples":
            lines = ["**Examples:**", ""]
            for sub_kind, text in section.value:
                if getattr(sub_kind, "value", sub_kind) == "examples":
                    lines += ["```pycon", text.strip(), "```", ""]
                else:
                    lines += [text.strip(), ""]
            parts.append("\n".join(lines).strip())
        elif kind == "deprecated":
            parts.append(f"**Deprecated** since {section.value.version}: {section.value.description.strip()}")
        else:
            title = section.title or kind.capitalize()
            items = section.value if isinstance(section.value, list) else [section.value]
            with_default = kind in ("parameters", "other parameters")
            parts.append("\n".join([f"**{title}:**", "", *(_item(item, with_default) for item in items)]))
    return "\n\n".join(part for part in parts if part)


def _public_members(obj: Any, options: dict[str, Any]) -> list[Any]:
    if not obj.is_class and not obj.is_module:
        return []
    pool = obj.all_members if options.get("inherited_members") else obj.members
    names = options.get("members")
    if isinstance(names, list):
        return [pool[name] for name in names if name in pool]
    if names is False:
        return []
    chosen = [member for name, member in pool.items() if not name.startswith("_")]
    return sorted(chosen, key=lambda member: getattr(member, "lineno", None) or 0)


def _kind(obj: Any) -> str:
    labels = getattr(obj, "labels", set())
    if "property" in labels:
        return "property"
    if obj.is_class:
        return "class"
    if obj.is_function:
        return "method" if obj.parent is not None and obj.parent.is_class else "function"
    return "attribute"


def object_markdown(obj: Any, options: dict[str, Any] | None = None, level: int = 2) -> str:
    """Markdown of one griffe object and, for a class, its public members one heading level down."""
    options = options or {}
    heading = str(options.get("heading") or obj.name)
    lines = [f"{'#' * min(level, 6)} {heading}", "", f"*{_kind(obj)}* {_code(obj.path)}", ""]
    if _kind(obj) != "property":
        lines += ["```python", signature(obj), "```", ""]
    elif getattr(obj, "annotation", None) is not None:
        lines += [f"Type: {_code(str(obj.annotation))}", ""]
    text = docstring_markdown(obj)
    if text:
        lines += [text, ""]
    for member in _public_members(obj, options):
        lines.append(object_markdown(member, {"heading": f"{heading}.{member.name}"}, level + 1))
    return "\n".join(lines)

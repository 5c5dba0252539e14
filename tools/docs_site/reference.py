"""The API reference pages, generated from the meta-package's export tables and the live classes.

Every name ``accel`` and ``accel.utils`` export becomes one entry: the public names it is reached by,
the object's own path (where its code lives, which is also its anchor on the site), and the
distribution that owns it. ``Accelerator`` gets a page of its own listing every public method and
property wherever it is defined (a mixin, a component, a base class), found on the class at build time,
so that the reference follows accel-train however its code is arranged.
"""

from __future__ import annotations

import dataclasses
import inspect

#: distribution -> one line saying what its page holds, in the dependency order of the design.
DISTRIBUTIONS = {
    "accel-state": "process state, enums, collectives, RNG, logging, environment and memory helpers",
    "accel-data": "sharded, dispatching and resumable data loaders",
    "accel-bigmodel": "empty-weight init, device maps, dispatch, offload hooks, checkpoint loading",
    "accel-quant": "bitsandbytes layers and FP8 model conversion",
    "accel-tracking": "experiment trackers behind one interface",
    "accel-train": "plugins, kwargs handlers, optimizer and scheduler wrappers, backend utilities",
    "accel-launch": "the launchers and launch helpers",
}


@dataclasses.dataclass
class Entry:
    """One exported object: how users reach it, where it is defined, and its page on the site."""

    public_names: list[str]
    identifier: str
    distribution: str
    kind: str
    summary: str

    @property
    def page(self) -> str:
        """The site path (relative to the docs folder) of the page that documents it."""
        if self.identifier == accelerator_identifier():
            return "reference/accelerator.md"
        return f"reference/{self.distribution}.md"


def _distribution(module_name: str) -> str:
    return module_name.split(".")[0].replace("_", "-")


def _kind(obj: object) -> str:
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return "constant"


def _summary(obj: object) -> str:
    if not callable(obj):
        return ""
    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def _source_module(module: str) -> str:
    """The module whose file defines ``module``'s code: an old path that accel-train keeps as an alias of a
    moved module (``accel_train.deepspeed_utils``) has no file of its own for the docs tool to read."""
    try:
        from accel_train import MOVED_MODULES
    except ImportError:
        return module
    return MOVED_MODULES.get(module, module)


def identifier_of(obj: object, module: str, name: str) -> str:
    """Where ``obj`` is defined (``module.qualname``); a constant is known by the module exporting it."""
    if callable(obj) and getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
        return f"{_source_module(obj.__module__)}.{obj.__qualname__}"
    return f"{_source_module(module)}.{name}"


def accelerator_identifier() -> str:
    """Where ``Accelerator`` is defined today."""
    from accel import Accelerator

    return f"{Accelerator.__module__}.{Accelerator.__qualname__}"


def entries() -> list[Entry]:
    """Every object ``accel`` and ``accel.utils`` export, once each, in export-table order."""
    import accel
    import accel.utils
    from accel import _exports

    found: dict[str, Entry] = {}
    for prefix, module, table in (("accel", accel, _exports.TOP_LEVEL), ("accel.utils", accel.utils, _exports.UTILS)):
        for name, defining_module in table.items():
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            identifier = identifier_of(obj, defining_module, name)
            entry = found.get(identifier)
            if entry is None:
                entry = found[identifier] = Entry([], identifier, _distribution(identifier), _kind(obj), _summary(obj))
            entry.public_names.append(f"{prefix}.{name}")
    return list(found.values())


def accelerator_members() -> dict[str, str]:
    """Public method / property name of ``Accelerator`` -> ``"method"`` or ``"property"``, from the class."""
    from accel import Accelerator

    members: dict[str, str] = {}
    for klass in Accelerator.__mro__:
        if not klass.__module__.startswith("accel"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in members:
                continue
            if isinstance(value, property):
                members[name] = "property"
            elif inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
                members[name] = "method"
    return dict(sorted(members.items()))


def anchors() -> dict[str, tuple[str, str]]:
    """Public name (``accel.X``, ``accel.utils.X``, ``Accelerator.m``) -> (page, anchor id) on the site."""
    found: dict[str, tuple[str, str]] = {}
    for entry in entries():
        for name in entry.public_names:
            found[name] = (entry.page, entry.identifier)
    accelerator = accelerator_identifier()
    for member in accelerator_members():
        found[f"Accelerator.{member}"] = ("reference/accelerator.md", f"{accelerator}.{member}")
    return found


def _block(entry: Entry) -> str:
    imports = " · ".join(
        f"<code>from {name.rsplit('.', 1)[0]} import {name.rsplit('.', 1)[1]}</code>" for name in entry.public_names
    )
    return (
        f'<p class="accel-import">{imports} (defined in <code>{entry.identifier.rsplit(".", 1)[0]}</code>)</p>\n\n'
        + (f'::: {entry.identifier}\n    options:\n      heading: "{entry.public_names[0]}"\n')
    )


def accelerator_page() -> str:
    """Markdown of the ``Accelerator`` page: the class with every public member it has at build time."""
    members = accelerator_members()
    methods = [name for name, kind in members.items() if kind == "method"]
    properties = [name for name, kind in members.items() if kind == "property"]
    identifier = accelerator_identifier()
    lines = [
        "# Accelerator",
        "",
        "`from accel import Accelerator` — the object a training script creates first. Below: its "
        f"constructor, then its {len(methods)} public methods and {len(properties)} properties, "
        "wherever in accel-train each is defined (this list is read from the class when the site is built).",
        "",
        f"::: {identifier}",
        "    options:",
        '      heading: "accel.Accelerator"',
        "      inherited_members: true",
        "      summary: true",
        "      members:",
        *[f"        - {name}" for name in members],
        "",
    ]
    return "\n".join(lines)


def distribution_page(distribution: str, found: list[Entry]) -> str:
    """Markdown of one distribution's page: each exported object it owns, top-level names first."""
    own = [e for e in found if e.distribution == distribution and e.page == f"reference/{distribution}.md"]
    own.sort(key=lambda e: (not any(n.count(".") == 1 for n in e.public_names), e.kind == "constant"))
    lines = [
        f"# {distribution}",
        "",
        f"`{distribution}` ({DISTRIBUTIONS.get(distribution, '')}): the {len(own)} objects of it that `accel` "
        "and `accel.utils` export. Each is shown under the name you import it by; its anchor is the path "
        "where its code lives.",
        "",
    ]
    for entry in own:
        lines.append(_block(entry))
    return "\n".join(lines)


def index_page(found: list[Entry]) -> str:
    """Markdown of the reference's front page: one table row per public name, linked to its entry."""
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings (Google style: `Args:`, `Returns:`, `Raises:`) and from the "
        "meta-package's export tables when the site is built, so it lists exactly what "
        "`from accel import ...` and `from accel.utils import ...` give you. The pages by distribution:",
        "",
        "- [Accelerator](accelerator.md): the class and every public method and property",
    ]
    for distribution, what in DISTRIBUTIONS.items():
        lines.append(f"- [{distribution}]({distribution}.md): {what}")
    lines += ["", "| name | kind | what it is |", "| --- | --- | --- |"]
    rows = []
    for entry in found:
        target = entry.page.removeprefix("reference/")
        for name in entry.public_names:
            rows.append((name.lower(), f"| [`{name}`]({target}#{entry.identifier}) | {entry.kind} | {entry.summary} |"))
    lines += [row for _, row in sorted(rows)]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Site path -> Markdown of every reference page."""
    found = entries()
    generated = {"reference/index.md": index_page(found), "reference/accelerator.md": accelerator_page()}
    for distribution in DISTRIBUTIONS:
        generated[f"reference/{distribution}.md"] = distribution_page(distribution, found)
    return generated


def has_own_docstring(name: str) -> bool:
    """True when the object a public name (``accel.X``, ``accel.utils.X``, ``Accelerator.m``) reaches has
    its own docstring; a constant counts as having one (its description is an attribute docstring)."""
    import accel
    import accel.utils

    if name.startswith("Accelerator."):
        member = name.split(".", 1)[1]
        for klass in accel.Accelerator.__mro__:
            if member in vars(klass):
                value = vars(klass)[member]
                value = getattr(value, "__func__", value)
                if getattr(value, "__name__", member) != member:
                    return False  # `clear = free_memory`: the site shows an alias entry, described only by its own docstring
                return bool((getattr(value, "__doc__", None) or "").strip())
        return False
    module = accel.utils if name.startswith("accel.utils.") else accel
    obj = getattr(module, name.rsplit(".", 1)[1])
    if not callable(obj):
        return True
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return bool((doc or "").strip())

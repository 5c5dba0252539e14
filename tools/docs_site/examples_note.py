"""The note on a guide page whose examples run in CI, with the accel and torch versions of the build.

Which blocks run is the runner's own rule (``tools/run_doc_examples.py``): the pages are its default
set (``docs/*.md``), and a block runs when it is ``python`` or ``bash`` and not only written to a file
(``file=``); one with ``run-if=`` runs where its condition holds and is reported as skipped elsewhere.
CI builds the site and then runs every such block in the same environment (``nox -s docs``), so the
versions installed when the site is built are the ones its examples run against: they are read
from the environment at build time, never typed by hand.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import pathlib
from collections.abc import Sequence
from typing import Protocol

#: The extra CSS class of the note's admonition, which ``tools/check_site.py`` looks for.
NOTE_CLASS = "ci-examples"


class _Block(Protocol):
    """What is read of a ``run_doc_examples.Block``."""

    attributes: dict[str, str]

    @property
    def runnable(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class ExampleCount:
    """How many blocks of a page the runner runs, and how many of those only under a ``run-if``."""

    runnable: int
    conditional: int


def count_examples(blocks: Sequence[_Block]) -> ExampleCount:
    """Count the runner's blocks (``run_doc_examples.Block``) that run, and those with a ``run-if``."""
    running = [block for block in blocks if block.runnable]
    return ExampleCount(len(running), sum("run-if" in block.attributes for block in running))


def installed_version(distribution: str, module: str | None = None) -> str:
    """The version of what the build imports: ``module.__version__`` when it has one (the code in use,
    even from a source checkout), else the installed distribution's metadata.

    Raises:
        LookupError: neither is there (the build cannot say what the examples run against).
    """
    try:
        version = getattr(importlib.import_module(module or distribution.replace("-", "_")), "__version__", None)
    except ImportError:
        version = None
    if isinstance(version, str) and version:
        return version
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(
            f"cannot tell which {distribution} the examples run against: it is neither importable with a "
            f"__version__ nor installed; install it in the environment that builds the site"
        ) from None


def build_versions() -> dict[str, str]:
    """``{"accel": ..., "torch": ...}`` as installed in the environment building the site."""
    return {"accel": installed_version("accel"), "torch": installed_version("torch")}


def sentence(count: ExampleCount, versions: dict[str, str]) -> str:
    """The note's text (Markdown, one paragraph)."""
    if count.runnable < 1:
        raise ValueError(f"a page gets the note only when an example of it runs; got {count.runnable} runnable blocks")
    if count.runnable == 1:
        what = "The runnable example on this page runs in CI"
        condition = " (only where its `run-if` condition holds)" if count.conditional else ""
    else:
        what = f"The {count.runnable} runnable examples on this page run in CI"
        condition = (
            f" ({count.conditional} of them only where their `run-if` condition holds)" if count.conditional else ""
        )
    built_with = ", ".join(f"{name} {version}" for name, version in versions.items())
    return (
        f"{what}{condition}, by `tools/run_doc_examples.py`, against the versions this page was built "
        f"with: {built_with}."
    )


def admonition(count: ExampleCount, versions: dict[str, str]) -> str:
    """The note as the HTML page shows it: a Material admonition with the class :data:`NOTE_CLASS`."""
    return f'!!! note {NOTE_CLASS} "Examples run in CI"\n\n    {sentence(count, versions)}\n'


def quote(count: ExampleCount, versions: dict[str, str]) -> str:
    """The note as the Markdown twin shows it: a plain blockquote."""
    return f"> **Examples run in CI.** {sentence(count, versions)}\n"


def runs_examples(path: pathlib.Path, pages: Sequence[pathlib.Path]) -> bool:
    """True when ``path`` is one of the runner's pages (so its blocks run in CI)."""
    resolved = path.resolve()
    return any(resolved == page.resolve() for page in pages)

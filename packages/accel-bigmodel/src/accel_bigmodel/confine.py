"""Keeping the files a loader opens inside the checkpoint they belong to, symbolic links included.

Names inside a checkpoint (index entries, offload entries) are already refused when absolute or when they
hold ``..``; a symbolic link is the other way out: ``shard.safetensors -> /etc/passwd`` passes every name
check and is then opened. `check_confined()` resolves a file (every link on its way) and refuses it when it
lands outside the folder, naming the link and its target.

One layout keeps its files elsewhere on purpose: the Hugging Face hub cache, whose
``<repo>/snapshots/<revision>/`` folders hold links into ``<repo>/blobs/``. For a folder inside such a
snapshot the allowed root is the repository's cache folder (`allowed_root()`), nothing wider.
"""

from __future__ import annotations

import os

from accel_state.errors import UnsafeCheckpointError

__all__ = ["allowed_root", "check_confined", "first_link"]

_LINK_HINT = (
    "A symbolic link in a checkpoint may point only inside it (or, in the Hugging Face hub cache, into the "
    "repository's blobs/); copy the file into the folder instead."
)


def allowed_root(folder: str) -> str:
    """The real path that every file of ``folder`` must resolve inside: the folder itself, or, for a folder
    under ``<repo>/snapshots/<revision>/`` where ``<repo>/blobs/`` exists (the hub cache), ``<repo>``.

    Args:
        folder: the checkpoint (or offload) folder, as given.
    """
    absolute = os.path.abspath(folder)
    current = absolute
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            return os.path.realpath(folder)
        # current is <repo>/snapshots/<revision> when parent is <repo>/snapshots
        if os.path.basename(parent) == "snapshots" and os.path.isdir(os.path.join(os.path.dirname(parent), "blobs")):
            return os.path.realpath(os.path.dirname(parent))
        current = parent


def first_link(path: str, folder: str) -> str | None:
    """The first symbolic link on the way from ``folder`` down to ``path`` (``path`` itself included), or
    ``None`` when there is none below ``folder``."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(folder))
    if relative.startswith(".."):
        return path if os.path.islink(path) else None
    current = os.path.abspath(folder)
    for part in relative.split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            return current
    return None


def check_confined(path: str, folder: str, refused: str | None = None, root: str | None = None) -> None:
    """Refuse ``path`` when it resolves (following every symbolic link) outside ``folder``'s allowed root.

    Args:
        path: the file a loader will open.
        folder: the checkpoint folder it belongs to.
        refused: the file named as refused (an index that names ``path``); ``path`` itself when not given.
        root: the allowed root, when the caller computed it once for many files (`allowed_root()`).

    Raises:
        UnsafeCheckpointError: ``path`` resolves outside; the message names the link and its target.
    """
    root = allowed_root(folder) if root is None else root
    resolved = os.path.realpath(path)
    if resolved == root or os.path.commonpath([root, resolved]) == root:
        return
    link = first_link(path, folder) or path
    try:
        target = os.readlink(link)
    except OSError:
        target = resolved
    what = f"a symbolic link {link!r} -> {target!r}, which resolves to {resolved!r} outside the folder {folder!r}"
    if refused is not None and refused != path:
        what = f"an entry naming {path!r}: {what}"
    raise UnsafeCheckpointError(refused or link, what, _LINK_HINT)

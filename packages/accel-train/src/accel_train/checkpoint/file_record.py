"""The manifest's record of a checkpoint's files (``files``: relative path -> size in bytes), and how a
folder differs from it.

The writer records every file of the partial folder once every process's files are written, just before
the manifest (which is not listed) and the atomic publish; sub-folders (DCP, DeepSpeed) are walked. A file
listed but gone, or of another size, is damage a load would trip on (or, worse, read); a file present but
not listed was added afterwards (a user's file carried over from the previous folder, the random states the
other processes add after a save of the main process alone) and is only worth a note. Stat calls only: no
file is opened, and no torch is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from accel_train.checkpoint.names import MANIFEST_NAME

__all__ = ["FileDifferences", "compare_files", "record_files"]


def record_files(folder: str) -> dict[str, int]:
    """Every file under ``folder`` but the manifest, as ``{relative path: size in bytes}`` (``/`` between
    folder names on every system), sorted by path.

    Args:
        folder: the checkpoint folder (a save's partial folder, complete).
    """
    files: dict[str, int] = {}
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative != MANIFEST_NAME:
                files[relative] = os.path.getsize(path)
    return dict(sorted(files.items()))


@dataclass
class FileDifferences:
    """How a folder differs from its manifest's ``files``.

    Attributes:
        missing: listed files that are absent.
        resized: ``(path, recorded size, size found)`` of listed files whose size differs.
        extra: files present but not listed (the manifest aside).
    """

    missing: list[str] = field(default_factory=list)
    resized: list[tuple[str, int, int]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)


def compare_files(folder: str, recorded: Mapping[str, int], with_extra: bool = True) -> FileDifferences:
    """Compare the files of ``folder`` with ``recorded`` (a manifest's ``files``): one stat per listed file,
    and one walk of the folder for the extra ones when ``with_extra``.

    Args:
        folder: the checkpoint folder.
        recorded: relative path -> size in bytes, as `record_files()` gave it at the save.
        with_extra: also list the files present but not recorded.
    """
    found = FileDifferences()
    for relative, size in sorted(recorded.items()):
        path = os.path.join(folder, *relative.split("/"))
        if not os.path.isfile(path):
            found.missing.append(relative)
            continue
        actual = os.path.getsize(path)
        if actual != size:
            found.resized.append((relative, size, actual))
    if with_extra:
        found.extra = [relative for relative in record_files(folder) if relative not in recorded]
    return found

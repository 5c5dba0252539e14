"""Errors shared by every package that reads checkpoints (accel-bigmodel, accel-train).

Kept here, in the common base of the dependency graph, so that the big-model loader and the
training checkpoints raise the same class and a caller catches one name.
"""

from __future__ import annotations

import os


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds something that reading it would execute or that leaves its folder.

    Raised instead of loading: nothing from the file ran and nothing was changed (the model and
    optimizer keep their values). ``path`` is the file, ``found`` what was refused (a pickled global
    such as ``posix.system``, an index entry pointing outside its folder, ...).

    Args:
        path: the file that was refused.
        found: what in it was refused.
        hint: what to do instead (appended to the message).
    """

    def __init__(self, path: str | os.PathLike[str], found: str, hint: str = "") -> None:
        self.path = os.fspath(path)
        self.found = found
        self.hint = hint
        message = f"Refusing to load checkpoint file {self.path!r}: it holds {found}."
        if hint:
            message += f" {hint}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # picklable across processes
        return (type(self), (self.path, self.found, self.hint))

"""Errors shared by every package that reads checkpoints (accel-bigmodel, accel-train).

Kept here, in the common base of the dependency graph, so that the big-model loader and the
training checkpoints raise the same class and a caller catches one name:
`UnsafeCheckpointError` for a file that would run code, `CorruptCheckpointError` for a
damaged one (both ``ValueError``; neither a subclass of the other).
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


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: truncated, corrupt, or not what its name says.

    The message names the file. `CorruptCheckpointError` is the damaged-file case.

    Args:
        *args: the message (as for any exception).
    """


#: What `CorruptCheckpointError` advises when the caller gives no hint of its own.
CORRUPT_HINT = (
    "The file is damaged or was not completely written (a copy or download cut short, a disk error): "
    "restore it from a good copy, or load an earlier checkpoint."
)


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is damaged: cut short, or holding bytes other than those that were written.

    This is damage, not an attack: the file is not a well-formed file of its format (a truncated
    safetensors file or zip, a CRC that does not match, a pickle stream that ends early or holds a byte
    that is no pickle opcode, a manifest that is not JSON). A well-formed file that asks to run code is
    an `UnsafeCheckpointError` instead; the two classes are unrelated, so a caller can tell them
    apart. ``load_state`` raises it before anything is loaded: the model and optimizer keep their values.

    Args:
        path: the damaged file.
        expected: what the file should hold (``"a safetensors header of 1184 bytes"``).
        found: what it holds instead (``"a file of 600 bytes"``).
        hint: what to do (appended to the message; by default: restore the file or load an earlier
            checkpoint).
    """

    def __init__(self, path: str | os.PathLike[str], expected: str, found: str, hint: str = CORRUPT_HINT) -> None:
        self.path = os.fspath(path)
        self.expected = expected
        self.found = found
        self.hint = hint
        message = f"Checkpoint file {self.path!r} is damaged: expected {expected}, found {found}."
        if hint:
            message += f" {hint}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:  # picklable across processes
        return (type(self), (self.path, self.expected, self.found, self.hint))

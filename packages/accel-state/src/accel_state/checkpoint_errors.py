"""The error every accel package raises for a checkpoint file that would run code when loaded."""

from __future__ import annotations

import os

__all__ = ["UnsafeCheckpointError"]


class UnsafeCheckpointError(ValueError):
    """A checkpoint file needs arbitrary code to load (a pickle of objects outside the allow-list): refused.

    Nothing of the file was executed and nothing was loaded into the model or optimizer.

    Args:
        path: the file that was refused.
        found: what was found in it (for example the Python global the pickle asks for).
    """

    def __init__(self, path: str | os.PathLike[str], found: str) -> None:
        self.path = os.fspath(path)
        self.found = found
        super().__init__(
            f"{self.path} holds Python objects that loading would have to execute ({found}); accel loads "
            "checkpoints without running code from them and refused this file. Re-save it with accel, or load it "
            "yourself if you trust its origin."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.found))

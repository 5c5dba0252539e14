"""Checkpoint folders on disk: written under a hidden name, swapped into place, numbered and pruned.

``save_state`` writes into ``.<name>.partial`` (:func:`begin`) and puts the complete folder in place
with :func:`swap_into_place`, atomically where the system allows (a kill leaves the previous folder or
the new one, never a mix). Automatic checkpoints are ``checkpoint_<n>`` folders (:func:`list_checkpoints`),
the oldest removed by :func:`prune`. What goes inside a folder is :mod:`accel_train.checkpointing`'s.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
from collections.abc import Callable

CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")


def partial_dir(final_dir: str) -> str:
    """The hidden sibling ``.<name>.partial`` that a save of ``final_dir`` writes into first."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    return os.path.join(parent, f".{name}.partial")


def old_dir(final_dir: str) -> str:
    """The hidden sibling ``.<name>.old`` where the previous folder waits when no atomic swap is possible."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    return os.path.join(parent, f".{name}.old")


def list_checkpoints(base: str) -> list[tuple[int, str]]:
    """Complete automatic checkpoints under ``base`` as ``(number, path)``, oldest first."""
    if not os.path.isdir(base):
        return []
    found = []
    for entry in os.listdir(base):
        match = CHECKPOINT_RE.match(entry)
        if match and os.path.isdir(os.path.join(base, entry)):
            found.append((int(match.group(1)), os.path.join(base, entry)))
    return sorted(found)


def begin(final_dir: str, is_writer: bool) -> str:
    """Create the empty partial folder (writer only) and return its path."""
    tmp = partial_dir(final_dir)
    if is_writer:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    return tmp


def exchange(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system cannot (another OS, an old kernel or file system), and the caller renames twice instead."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"could not swap {b} into place: {os.strerror(code)}", b)


def swap_into_place(tmp: str, final_dir: str, owned: Callable[[str], bool]) -> None:
    """Put the complete folder ``tmp`` at ``final_dir``; a kill at any moment leaves the previous folder or
    the new one there (never a mix). Entries of the previous folder that ``owned`` does not claim (files
    the user put there) move into the new one first; the previous folder is removed only once the new one
    is in place (where the system cannot swap atomically, it waits as ``.<name>.old``, which a load finds).
    """
    final_dir = os.path.abspath(final_dir)
    if not os.path.exists(final_dir):
        os.rename(tmp, final_dir)
        return
    if not os.path.isdir(final_dir):
        raise NotADirectoryError(f"cannot write to {final_dir}: it is a file")
    for entry in os.listdir(final_dir):
        if not owned(entry) and not os.path.exists(os.path.join(tmp, entry)):
            os.rename(os.path.join(final_dir, entry), os.path.join(tmp, entry))
    if exchange(tmp, final_dir):
        shutil.rmtree(tmp, ignore_errors=True)  # now the previous folder
        return
    old = old_dir(final_dir)
    if os.path.exists(old):
        shutil.rmtree(old)
    os.rename(final_dir, old)
    os.rename(tmp, final_dir)
    shutil.rmtree(old, ignore_errors=True)


def discard(tmp: str) -> None:
    """Remove a partial folder after a failed save (the previous checkpoint is untouched)."""
    shutil.rmtree(tmp, ignore_errors=True)


def prune(base: str, total_limit: int | None, keep: str) -> list[str]:
    """Delete the oldest complete checkpoints so that at most ``total_limit`` remain; never ``keep``."""
    if total_limit is None:
        return []
    checkpoints = [path for _, path in list_checkpoints(base)]
    removed = []
    while len(checkpoints) > total_limit:
        oldest = checkpoints.pop(0)
        if os.path.abspath(oldest) == os.path.abspath(keep):
            continue
        shutil.rmtree(oldest, ignore_errors=True)
        removed.append(oldest)
    return removed

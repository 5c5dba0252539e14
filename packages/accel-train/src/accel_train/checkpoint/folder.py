"""The life of a checkpoint folder: written into a hidden partial sibling, swapped into place whole.

A save writes ``.<name>.<token>.partial`` (one per save; one save at a time holds the folder's lock,
`accel_train.checkpoint.folder_lock`) and `publish()` swaps it into place in one step, so a process killed
at any moment leaves the previous checkpoint or the new one, never a mix. `resolve_input_dir()` finds a
folder to load (or the previous copy of a save killed mid-swap); `prune()` applies ``total_limit``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import Any

from accel_train.checkpoint.names import OWNED_RE, CheckpointMismatchError, entry_patterns, matches_any
from accel_train.checkpoint.numbering import list_checkpoints

logger = logging.getLogger(__name__)


def partial_dir(final_dir: str, token: str | None = None) -> str:
    """The hidden folder a save of ``final_dir`` writes into: ``.<name>.<token>.partial`` (one per save, so
    two writers never share one), or ``.<name>.partial`` without a token."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    middle = f".{token}" if token else ""
    return os.path.join(parent, f".{name}{middle}.partial")


def new_save_token() -> str:
    """A fresh name part for one save's partial folder; process 0's is also the save's id
    (`accel_train.checkpoint.save_id`), so it is long enough (32 hexadecimal digits) never to repeat."""
    import secrets

    return secrets.token_hex(16)


def _stale_partials(final_dir: str) -> list[str]:
    """Partial folders of earlier saves of ``final_dir`` that never finished (killed mid-save)."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    pattern = re.compile(rf"^\.{re.escape(name)}(\.[0-9a-f]+)?\.partial$")
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    return [os.path.join(parent, entry) for entry in entries if pattern.match(entry)]


def _old_dir(final_dir: str) -> str:
    parent, name = os.path.split(os.path.abspath(final_dir))
    return os.path.join(parent, f".{name}.old")


def begin(final_dir: str, token: str) -> str:
    """Create this save's empty partial folder and return its path; the writer calls it holding the
    folder's lock (`accel_train.checkpoint.folder_lock`), so the partial folders of earlier saves of
    the same folder are leftovers of killed saves, and are removed first.

    Args:
        final_dir: the checkpoint folder being saved.
        token: this save's name part (`new_save_token()`).
    """
    for stale in _stale_partials(final_dir):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = partial_dir(final_dir, token)
    os.makedirs(tmp)
    return tmp


def _exchange(a: str, b: str) -> bool:
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
    if _exchange(tmp, final_dir):
        shutil.rmtree(tmp, ignore_errors=True)  # now the previous folder
        return
    old = _old_dir(final_dir)
    if os.path.exists(old):
        shutil.rmtree(old)
    os.rename(final_dir, old)
    os.rename(tmp, final_dir)
    shutil.rmtree(old, ignore_errors=True)


def publish(tmp: str, final_dir: str, entries: Mapping[str, Any] | None = None) -> None:
    """Rename the complete partial folder into place, replacing an older one of the same name atomically.

    Args:
        tmp: the complete partial folder.
        final_dir: where it goes.
        entries: the checkpoint entries of the strategy that saved (`Strategy.checkpoint_entries()`): a
            previous folder's entries of that kind are the checkpoint's, not the user's, so they are not
            carried into the new folder (the documented names are always the checkpoint's).
    """
    patterns = entry_patterns(entries)
    swap_into_place(tmp, final_dir, lambda entry: bool(OWNED_RE.match(entry) or matches_any(entry, patterns)))


def discard(tmp: str) -> None:
    """Remove a partial folder after a failed save (the previous checkpoint is untouched)."""
    shutil.rmtree(tmp, ignore_errors=True)


def resolve_input_dir(input_dir: str) -> str:
    """The folder to load: ``input_dir``, or the previous copy left by a save killed mid-swap."""
    if os.path.isdir(input_dir):
        name = os.path.basename(os.path.normpath(input_dir))
        if name.startswith(".") and name.endswith(".partial"):
            raise CheckpointMismatchError(
                f"{input_dir} is an incomplete checkpoint (a save was interrupted); load another one"
            )
        return input_dir
    old = _old_dir(input_dir)
    if os.path.isdir(old):
        logger.warning("%s is missing but its previous version %s is complete: loading that", input_dir, old)
        return old
    raise FileNotFoundError(f"Tried to find {input_dir} but folder does not exist: no checkpoint folder there")


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

"""One writer at a time per checkpoint folder.

Two jobs given the same ``output_dir`` (or a requeued job that overlaps the one it replaces) would
otherwise write the same partial folder and swap half of each into place. Each save of a folder takes
an exclusive lock on a hidden file beside it, ``.<name>.lock``, for as long as it writes and swaps the
folder; a second writer waits for it (so the last save to finish wins, whole) and, after
``ACCEL_CHECKPOINT_LOCK_TIMEOUT`` seconds (default 600), gives up with `CheckpointLockedError` naming the
folder and the process holding it.

The lock is the operating system's (``flock``): a writer that dies releases it with its last file
descriptor, so a killed save never blocks the next one (its lock file stays, and the next save reuses
it). A writer removes the lock file when it is done, while still holding it; a writer that was
waiting on the removed file sees that it no longer has a name and locks the new one instead.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from types import TracebackType

#: Environment variable: how long a save waits for another writer of the same folder, in seconds.
LOCK_TIMEOUT_ENV = "ACCEL_CHECKPOINT_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 600.0


class CheckpointLockedError(OSError):
    """Another process kept the checkpoint folder's lock for longer than this save would wait."""


def lock_timeout(environ: dict[str, str] | None = None) -> float:
    """The wait for another writer of the same folder, from ``ACCEL_CHECKPOINT_LOCK_TIMEOUT`` (seconds).

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: the variable is set to something that is not a number of seconds >= 0.
    """
    raw = (os.environ if environ is None else environ).get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds >= 0 (e.g. 600, or 0 to not wait)")
    return value


def lock_path(final_dir: str) -> str:
    """``<parent>/.<name>.lock``: the lock file of the checkpoint folder ``final_dir``."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    return os.path.join(parent, f".{name}.lock")


class FolderLock:
    """The exclusive lock on writing one checkpoint folder (a context manager, or `acquire` / `release`).

    Args:
        final_dir: the checkpoint folder to be written (it need not exist; its parent must).
        timeout: how long `acquire` waits for another holder, in seconds (default: `lock_timeout()`).
    """

    def __init__(self, final_dir: str, timeout: float | None = None) -> None:
        self.folder = os.path.abspath(final_dir)
        self.path = lock_path(final_dir)
        self.timeout = lock_timeout() if timeout is None else timeout
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, waiting up to ``timeout`` seconds for another writer to finish.

        Raises:
            CheckpointLockedError: another process still holds it after ``timeout`` seconds.
            OSError: the lock file cannot be created (a read-only folder, ...), naming it.
        """
        try:
            import fcntl
        except ImportError:  # no flock on this system: one writer per folder is the user's to ensure
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        pause = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _names(fd, self.path):
                    break
                # The holder before us removed the file on release: this lock guards nothing; take the new one.
                os.close(fd)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise CheckpointLockedError(
                        errno.EBUSY,
                        f"another process ({holder}) is still writing the checkpoint folder {self.folder} after "
                        f"{self.timeout:g} s; two runs are saving to the same folder. Give each run its own "
                        f"output folder, or raise {LOCK_TIMEOUT_ENV} to wait longer",
                        self.path,
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
        self._fd = fd
        try:  # who holds it, for the message of a writer that gives up waiting (best effort: a full disk)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        except OSError:
            pass

    def release(self) -> None:
        """Let the next writer in (nothing happens when the lock is not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # still locked: a writer waiting on this file sees it gone and opens a new one
        except OSError:
            pass
        os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


def _names(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced since it was opened)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "unknown process"

"""The background part of an asynchronous save: one writer thread, and how its processes hear of each other.

`BackgroundSave` runs the writing of a staged state (`accel_train.checkpoint.staging`) in a thread and
keeps its outcome; ``wait()`` returns the published folder or raises `AsyncCheckpointError` (naming the
folder and the cause). The interpreter does not exit before a started save has finished (the thread is
not a daemon), and a failure nobody waited for is logged at exit.

The processes of one save tell each other how their part went through the key-value store of the
default process group (`announce()` / `hear()`), never through collectives: the training process group
stays the training loop's alone while a save is being written.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import errno
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from accel_train.checkpoint import outcome

__all__ = ["AsyncCheckpointError", "BackgroundSave", "announce", "hear", "side_group", "using_side_group"]

logger = logging.getLogger(__name__)

#: What a process of an asynchronous save announces when its part succeeded.
_OK = "ok"

_pending: set[BackgroundSave] = set()
_pending_lock = threading.Lock()
_exit_hook_installed = False


class AsyncCheckpointError(OSError):
    """An asynchronous ``save_state`` failed in the background; the folder it was saving was not published
    (an earlier checkpoint there is unchanged).

    Raised by the next checkpoint call of the Accelerator (``save_state``, ``load_state``,
    ``wait_for_checkpoint``, ``end_training``) on every process of the save.

    Attributes:
        folder: the checkpoint folder the failed save was writing.
        cause: the error of the write (also the exception's ``__cause__``).
    """

    def __init__(self, folder: str, cause: BaseException) -> None:
        code = cause.errno if isinstance(cause, OSError) and cause.errno is not None else errno.EIO
        super().__init__(
            code,
            f"the asynchronous save_state of {folder} failed: {cause}. The folder was not published (a checkpoint "
            "that was there before is unchanged); fix the cause and save again",
        )
        self.filename = folder
        self.folder = folder
        self.cause = cause


class BackgroundSave:
    """One asynchronous save being written by a thread of its own.

    Args:
        folder: the checkpoint folder it publishes (returned by `wait()`).
        job: writes the staged state and publishes the folder; raises on failure.
    """

    def __init__(self, folder: str, job: Callable[[], None]) -> None:
        self.folder = folder
        self._job = job
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"accel-save-state:{folder}", daemon=False)

    def start(self) -> BackgroundSave:
        """Start writing; returns ``self``."""
        _install_exit_hook()
        with _pending_lock:
            _pending.add(self)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._job()
        except BaseException as error:  # kept for wait(): a thread's exception would otherwise only be printed
            self._error = error

    def done(self) -> bool:
        """Whether the writing has ended (successfully or not)."""
        return not self._thread.is_alive()

    def wait(self) -> str:
        """Block until the save has ended; returns the published folder.

        Raises:
            AsyncCheckpointError: the save failed (the folder was not published).
        """
        self._thread.join()
        with _pending_lock:
            _pending.discard(self)
        if self._error is not None:
            raise AsyncCheckpointError(self.folder, self._error) from self._error
        return self.folder


def _wait_all_at_exit() -> None:
    """Interpreter exit: let every started save end, and log those that failed unnoticed."""
    with _pending_lock:
        saves = list(_pending)
    for save in saves:
        try:
            save.wait()
        except AsyncCheckpointError as error:
            logger.error("%s", error)


def _install_exit_hook() -> None:
    global _exit_hook_installed
    with _pending_lock:
        if not _exit_hook_installed:
            atexit.register(_wait_all_at_exit)
            _exit_hook_installed = True


def announce(store: Any, key: str, failure: BaseException | None) -> None:
    """Tell the other processes of the save how this part went (``failure`` `None`: it succeeded)."""
    described = outcome.describe(failure)
    store.set(key, _OK if described is None else described)


def hear(store: Any, keys: Sequence[str], what: str) -> None:
    """Wait for every process's announcement under ``keys`` (in rank order) and raise the first failure.

    Raises:
        OSError: naming the process that failed first and its reason (`accel_train.checkpoint.outcome`).
    """
    store.wait(list(keys))
    answers = [store.get(key).decode() for key in keys]
    error = outcome.combined_error([None if answer == _OK else answer for answer in answers], what)
    if error is not None:
        raise error


_side_group: contextvars.ContextVar[Any] = contextvars.ContextVar("accel_save_side_group", default=None)


def side_group() -> Any:
    """The process group the sharded writes of this thread's save run their collectives on (`None`: the
    default group, as in a synchronous save)."""
    return _side_group.get()


@contextlib.contextmanager
def using_side_group(group: Any) -> Iterator[None]:
    """Run the block's sharded (DCP) writes on ``group``, a gloo group of their own, so that a background
    save's collectives never interleave with the training loop's on the default group."""
    token = _side_group.set(group)
    try:
        yield
    finally:
        _side_group.reset(token)

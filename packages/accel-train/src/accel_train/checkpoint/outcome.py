"""Every process of a save agrees on how it went: the same error on every rank, none left waiting.

A save is a sequence of writes on every process with collectives between them (a sharded folder is
written by all ranks together). If one rank raised at its first failed write, the others would wait
for it in the next collective forever. So while a save runs, a failed write is *recorded* instead of
raised (`collecting()`; `accel_train.checkpoint.file_io.writing` records into it), the rank goes on
through the same collectives as the others, and at each step's end `agree()` exchanges every rank's
first failure in one collective: every rank raises the same ``OSError`` (errno, path, reason and the
rank where it happened), or none does.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno as errno_module
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class WriteFailures:
    """The first failed write of this process during one step of a save (later ones are its echoes)."""

    first: OSError | None = None

    def record(self, error: OSError) -> None:
        if self.first is None:
            self.first = error


_collecting: contextvars.ContextVar[WriteFailures | None] = contextvars.ContextVar("accel_save_failures", default=None)


def current() -> WriteFailures | None:
    """The failures being collected by the save running in this context (`None` outside one)."""
    return _collecting.get()


@contextlib.contextmanager
def collecting() -> Iterator[WriteFailures]:
    """Record failed writes instead of raising them, for the duration of the block."""
    failures = WriteFailures()
    token = _collecting.set(failures)
    try:
        yield failures
    finally:
        _collecting.reset(token)


def describe(error: BaseException | None) -> str | None:
    """A failure as JSON text for the exchange (`None`: this rank succeeded)."""
    if error is None:
        return None
    if isinstance(error, OSError):
        code = error.errno if error.errno is not None else errno_module.EIO
        reason = error.strerror or str(error)
        path = error.filename
    else:
        code, reason, path = errno_module.EIO, f"{type(error).__name__}: {error}", None
    return json.dumps({"errno": code, "reason": reason, "path": None if path is None else str(path)})


def combined_error(described: list[str | None], what: str) -> OSError | None:
    """The error every rank raises: the failure of the lowest rank that failed, naming it.

    Args:
        described: each rank's `describe()` result, in rank order.
        what: the step that failed, for the message (``"save_state"`` ...).
    """
    for rank, text in enumerate(described):
        if text is None:
            continue
        failure = json.loads(text)
        others = [r for r, t in enumerate(described) if t is not None and r != rank]
        also = f"; processes {others} failed too" if others else ""
        where = f" on process {rank}" if len(described) > 1 else ""
        message = f"{what} failed{where}: {failure['reason']}{also}"
        error = OSError(failure["errno"], message)
        error.filename = failure["path"]
        return error
    return None


def agree(failure: BaseException | None, what: str, payload: str = "") -> list[str]:
    """Exchange this rank's failure (or `None`) with every other rank and raise the combined one.

    A collective: every process of the run calls it at the same point. A no-op exchange at world size 1.

    Args:
        failure: this rank's first failure of the step, or `None`.
        what: the step, for the message.
        payload: a string this rank hands to the others in the same exchange (the writer's name of the
            partial folder, for one).

    Returns:
        Every rank's ``payload``, in rank order, when no rank failed.

    Raises:
        OSError: on every rank, when any rank failed; the same errno, path and message everywhere.
    """
    from accel_state.operations import gather_object, world_size

    mine = [payload, describe(failure)]
    everyone = [mine] if world_size(what) == 1 else list(gather_object([mine]))
    error = combined_error([described for _, described in everyone], what)
    if error is not None:
        raise error from failure
    return [str(given) for given, _ in everyone]


# -- a writer saving alone, and the processes waiting for its folder (through the store) ----------------------

#: The store value a writer saving alone leaves under the save's key: published, or failed with its error.
PUBLISHED = "published"
FAILED = "failed:"


def published(save_id: str = "") -> str:
    """The store value of a published save, with the save's id for the processes that add their files."""
    return f"{PUBLISHED}:{save_id}" if save_id else PUBLISHED


def tell_waiters(store: Any, key: str, failure: BaseException | None, save_id: str = "") -> None:
    """Leave under ``key`` whether the writer's save was published (``failure`` is `None`; with the save's
    id) or failed."""
    store.set(key, published(save_id) if failure is None else FAILED + (describe(failure) or ""))


def wait_for_writer(store: Any, key: str) -> str:
    """Wait until the writer of a save has left its outcome under ``key``; return the save's id (``""``
    when the writer gave none), or raise the writer's own error (the same `OSError` it raised) when its
    save failed."""
    store.wait([key])
    answer = store.get(key).decode()
    if answer.startswith(FAILED):
        error = combined_error([answer[len(FAILED) :]], "save_state")
        if error is not None:
            raise error
    return answer.partition(":")[2] if answer.startswith(PUBLISHED) else ""

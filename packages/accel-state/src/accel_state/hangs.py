"""Collectives that a peer never enters end with an error that says who is missing.

Without help, a collective that one process skips (or reaches much later) waits until the process
group's timeout (``InitProcessGroupKwargs(timeout=...)``) and then fails with a transport message
("Timed out waiting 10000ms for send operation", "Connection closed by peer") that names neither
the operation nor the absent process. `watched_collective()` wraps accel's collectives: each
call gets a number (the how-manieth collective of this process); when one fails because of a
timeout or a vanished peer, every failing process writes where it stands into the process group's
store, waits a few seconds for the others' notes, and raises `CollectiveTimeoutError`
naming the operation, its number, the processes that did not arrive and where each of them is.

Nothing runs on the normal path beyond a counter and a ``try``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds a failing process waits for the notes of the other processes.
REPORT_GRACE_SECONDS = 5.0

_PEER_FAILURE_MARKERS = (
    "timed out",
    "timeout",
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
)
_KEY_PREFIX = "accel/collective_failure"


class CollectiveTimeoutError(RuntimeError):
    """A collective did not complete because some processes never entered it (or died)."""

    def __init__(self, message: str, operation: str, missing: list[int]) -> None:
        super().__init__(message)
        self.operation = operation
        self.missing = missing


class _Local(threading.local):
    depth = 0
    count = 0


_local = _Local()


def collective_count() -> int:
    """How many watched collectives this process (thread) has entered."""
    return _local.count


def is_peer_failure(error: BaseException) -> bool:
    """True for the errors a collective raises when a peer does not take part (timeout, closed link)."""
    text = str(error).lower()
    return any(marker in text for marker in _PEER_FAILURE_MARKERS)


def watched_collective(name: str | None = None) -> Callable[[F], F]:
    """Decorate a collective so that a missing peer turns into `CollectiveTimeoutError`.

    Nested watched calls (a collective built from others) count once, under the outer name.
    """

    def decorate(function: F) -> F:
        label = name or function.__name__

        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _local.depth:
                return function(*args, **kwargs)
            _local.count += 1
            number = _local.count
            _local.depth += 1
            started = time.monotonic()
            try:
                return function(*args, **kwargs)
            except CollectiveTimeoutError:
                raise
            except Exception as error:
                if not is_peer_failure(error) or not _distributed():
                    raise
                raise explain_failure(label, number, time.monotonic() - started, error) from error
            finally:
                _local.depth -= 1

        return wrapper  # type: ignore[return-value]

    return decorate


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _store() -> Any:
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def exchange_positions(
    store: Any, rank: int, world_size: int, position: dict[str, Any], grace: float
) -> dict[int, dict[str, Any]]:
    """Write this process's ``position`` to ``store`` and collect the others' for up to ``grace`` s."""
    from datetime import timedelta

    found: dict[int, dict[str, Any]] = {rank: position}
    if store is None:
        return found
    try:
        store.set_timeout(timedelta(seconds=max(grace, 1.0)))
        store.set(f"{_KEY_PREFIX}/{rank}", json.dumps(position))
    except Exception:
        return found
    deadline = time.monotonic() + grace
    while len(found) < world_size:
        for other in range(world_size):
            if other in found:
                continue
            key = f"{_KEY_PREFIX}/{other}"
            try:
                if store.check([key]):
                    found[other] = json.loads(store.get(key))
            except Exception:
                return found
        if len(found) == world_size or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return found


def describe(
    operation: str, number: int, rank: int, elapsed: float, positions: dict[int, dict[str, Any]], world_size: int
) -> tuple[str, list[int]]:
    """The message of a failed collective and the ranks that did not arrive (pure)."""
    missing = []
    whereabouts = []
    for other in range(world_size):
        if other == rank:
            continue
        seen = positions.get(other)
        if seen is not None and not _recent(seen, positions.get(rank), elapsed):
            seen = None  # a note left by an earlier failure
        if seen is not None and seen.get("operation") == operation and seen.get("number") == number:
            continue
        missing.append(other)
        if seen is None:
            whereabouts.append(
                f"rank {other} is not in any accel collective (still computing, stuck elsewhere, or exited)"
            )
        else:
            whereabouts.append(
                f"rank {other} waits in `{seen.get('operation')}` (its collective #{seen.get('number')})"
            )
    if missing:
        who = f"rank(s) {', '.join(str(r) for r in missing)} did not arrive: " + "; ".join(whereabouts)
    else:
        who = "every rank arrived, but the transport failed (a peer may have died during the operation)"
    message = (
        f"collective `{operation}` (#{number} on rank {rank}) did not complete after {elapsed:.1f} s: {who}. "
        "Every process must call the same collectives in the same order; the time limit is the "
        "process group's timeout (InitProcessGroupKwargs(timeout=...)); ACCELERATE_DEBUG_MODE=1 also "
        "compares the shapes sent."
    )
    return message, missing


def _recent(note: dict[str, Any], own: dict[str, Any] | None, elapsed: float) -> bool:
    if own is None or "failed_at" not in note or "failed_at" not in own:
        return True
    return abs(float(note["failed_at"]) - float(own["failed_at"])) <= elapsed + 3 * REPORT_GRACE_SECONDS


def explain_failure(operation: str, number: int, elapsed: float, error: BaseException) -> CollectiveTimeoutError:
    """Exchange positions with the other processes and build the error for a failed collective."""
    import torch.distributed as dist

    rank = dist.get_rank()
    world_size = dist.get_world_size()
    position = {"operation": operation, "number": number, "pid": os.getpid(), "failed_at": time.time()}
    grace = float(os.environ.get("ACCEL_COLLECTIVE_REPORT_GRACE", REPORT_GRACE_SECONDS))
    positions = exchange_positions(_store(), rank, world_size, position, grace)
    message, missing = describe(operation, number, rank, elapsed, positions, world_size)
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CollectiveTimeoutError(f"{message}\nCause: {first_line}", operation, missing)

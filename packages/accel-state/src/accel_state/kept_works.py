"""accel's collectives keep their last works referenced from Python, so that no gloo thread frees them
while the interpreter shuts down.

A gloo collective runs on one of the process group's worker threads. The thread wakes the waiting
caller, and only a moment later drops its own reference to the finished work; when that reference is
the last one, the thread frees the work's tensors. Tensors made in Python need the GIL to be freed.
If the script has ended in that moment, the interpreter is already shutting down, Python ends the
thread in the middle of a C++ destructor, and the C++ runtime aborts the process: ``terminate called
without an active exception``, SIGABRT, after the script printed its result, and the launcher reports
the run as failed (issue 37; seen once in about fifty 2-process runs on a loaded machine; torch's own
thread, as pytorch/pytorch#190489 shows without accel).

accel's collectives therefore wait through `wait_and_keep()`, which, when the default group is
gloo's, keeps the last few works in a queue: the worker thread's reference is then never the last one,
and the main thread frees each work when newer ones push it out. At exit (`pin_kept_works()`,
registered with `atexit` below) the works still queued are kept for good: the process is
ending, and a work that is never freed cannot be freed by the wrong thread. The object collectives
take the same path on gloo (`all_gather_object()`, `broadcast_object_list()`), since torch's own drop
their works inside torch.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import io
import pickle
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_object", "broadcast_object_list", "pin_kept_works", "wait_and_keep"]

#: How many finished works stay referenced: a few more than gloo's worker threads (2 by default), so a
#: work leaves the queue only after later collectives have run on every thread.
KEPT_WORKS = 8

_KEPT: collections.deque[Any] = collections.deque(maxlen=KEPT_WORKS)
_PINNED: list[Any] = []


def wait_and_keep(work: Any) -> None:
    """Wait for ``work`` (what a ``torch.distributed`` collective returns with ``async_op=True``) and
    keep it referenced, so that the main thread, not a gloo worker thread, frees it.

    Args:
        work: The collective's work handle; ``None`` (a rank outside the group) is ignored.
    """
    if work is None:
        return
    work.wait()
    if _keeps_works():
        _KEPT.append(work)


def _keeps_works() -> bool:
    """Whether the default group is gloo's alone: its works hold host memory and its threads free them.
    Works of other backends (NCCL's hold device memory) are left to their backend, as before."""
    return dist.is_initialized() and dist.get_backend() == "gloo"


def kept_works() -> int:
    """How many finished works are referenced now (for tests)."""
    return len(_KEPT)


def pin_kept_works() -> None:
    """At exit: keep the queued works for good (they are never freed, so no thread frees them late)."""
    if not _KEPT:
        return
    if not _PINNED:
        # one extra reference that nothing gives back: the list outlives the module's teardown
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_PINNED))
    _PINNED.extend(_KEPT)
    _KEPT.clear()


def _on_gloo(group: Any = None) -> bool:
    return dist.get_backend(group) == "gloo"


def _to_bytes_tensor(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def _from_bytes(tensor: torch.Tensor, size: int) -> Any:
    return pickle.loads(tensor[:size].numpy().tobytes())


def _sizes(local: torch.Tensor, group: Any) -> list[int]:
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size(group))]
    wait_and_keep(dist.all_gather(sizes, torch.tensor([local.numel()], dtype=torch.long), group=group, async_op=True))
    return [int(size) for size in sizes]


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """``torch.distributed.all_gather_object``: ``object_list[i]`` becomes process ``i``'s ``obj``.

    On gloo the bytes travel through `wait_and_keep()`; on other backends torch's own function runs.

    Args:
        object_list: A list of the group's size, filled in place.
        obj: This process's picklable object.
        group: The process group (the default group when None).
    """
    if not _on_gloo(group):
        dist.all_gather_object(object_list, obj, group=group)
        return
    payload = _to_bytes_tensor(obj)
    sizes = _sizes(payload, group)
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: payload.numel()] = payload
    received = [torch.empty_like(padded) for _ in sizes]
    wait_and_keep(dist.all_gather(received, padded, group=group, async_op=True))
    object_list[:] = [_from_bytes(tensor, size) for tensor, size in zip(received, sizes)]


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """``torch.distributed.broadcast_object_list``: the items of process ``src``'s list replace, in place,
    those of every other process's list (of the same length).

    Args:
        object_list: The list to send (on ``src``) or to overwrite (elsewhere).
        src: The global rank whose list is sent.
        group: The process group (the default group when None).
    """
    if not _on_gloo(group):
        dist.broadcast_object_list(object_list, src=src, group=group)
        return
    is_source = dist.get_rank() == src
    payload = _to_bytes_tensor(list(object_list)) if is_source else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.long)
    wait_and_keep(dist.broadcast(size, src=src, group=group, async_op=True))
    if not is_source:
        payload = torch.empty(int(size), dtype=torch.uint8)
    wait_and_keep(dist.broadcast(payload, src=src, group=group, async_op=True))
    if not is_source:
        received = _from_bytes(payload, int(size))
        if len(received) != len(object_list):
            raise ValueError(
                f"broadcast_object_list: process {src} sent {len(received)} objects, this process's list has "
                f"{len(object_list)}; every process must pass a list of the same length"
            )
        object_list[:] = received


atexit.register(pin_kept_works)  # whoever started the process group; a no-op when nothing was kept

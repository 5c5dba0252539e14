"""Background prefetch of offloaded weights: while one block runs, the next block is read.

Offloaded hooks are registered in module order (the order a forward usually visits them) and
grouped into chunks of at least ``chunk_bytes`` (one chunk per big block, many small layers per
chunk). When a chunk is used, the next one is read on a worker thread; disk reads and host-to-device
copies release the GIL, so they overlap with compute. At most two chunks are held: the one in use
and the one being read. A hook asked for out of order is read directly, so any call order is correct.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from accel_bigmodel.tensor_io import FileHandles, read_coalesced

DEFAULT_CHUNK_BYTES = 4 * 2**20


class WeightPrefetcher:
    """Reads the weights of registered hooks ahead of their forward."""

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self.hooks: list[Any] = []
        self.sizes: list[int] = []
        self.chunk_of: list[int] = []
        self.chunk_slots: list[list[int]] = []
        self._current_chunk = -1
        self._current: dict[int, list[torch.Tensor]] = {}
        self._pending: tuple[int, Future[dict[int, list[torch.Tensor]]]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._last_chunk_bytes = 0
        self._handles = FileHandles()

    def register(self, hook: Any, nbytes: int) -> int:
        """Add ``hook`` (an offloading AlignDevicesHook) as the next slot; returns its slot index."""
        slot = len(self.hooks)
        self.hooks.append(hook)
        self.sizes.append(nbytes)
        if not self.chunk_slots or self._last_chunk_bytes >= self.chunk_bytes:
            self.chunk_slots.append([])
            self._last_chunk_bytes = 0
        self.chunk_slots[-1].append(slot)
        self._last_chunk_bytes += nbytes
        self.chunk_of.append(len(self.chunk_slots) - 1)
        hook.prefetcher = self
        hook.prefetch_slot = slot
        return slot

    def _read_chunk(self, chunk: int) -> dict[int, list[torch.Tensor]]:
        slots = self.chunk_slots[chunk]
        plans = [self.hooks[slot].read_plan() for slot in slots] if len(slots) > 1 else [None]
        if any(plan is None for plan in plans):
            return {slot: self.hooks[slot].materialize() for slot in slots}
        flat = [item for plan in plans for item in plan]  # type: ignore[union-attr]
        tensors = read_coalesced([location for location, _ in flat], self._handles)
        result: dict[int, list[torch.Tensor]] = {}
        at = 0
        for slot, plan in zip(slots, plans):
            raw = []
            for (_, wanted), tensor in zip(plan, tensors[at : at + len(plan)]):  # type: ignore[arg-type]
                raw.append(tensor if tensor.dtype == wanted else tensor.to(wanted))
            at += len(plan)  # type: ignore[arg-type]
            result[slot] = self.hooks[slot].finish(raw)
        return result

    def _submit(self, chunk: int) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accel-prefetch")
        self._pending = (chunk, self._executor.submit(self._read_chunk, chunk))

    def fetch(self, slot: int) -> list[torch.Tensor]:
        """The materialised weights of ``slot``; schedules the read of the following chunk."""
        chunk = self.chunk_of[slot]
        with self._lock:
            if chunk != self._current_chunk:
                pending = self._pending
                self._pending = None
                if pending is not None and pending[0] == chunk:
                    self._current = pending[1].result()
                else:
                    if pending is not None:
                        try:  # finish (and drop) a read made for another order
                            pending[1].result()
                        except Exception:
                            pass
                    self._current = self._read_chunk(chunk)
                self._current_chunk = chunk
                self._submit((chunk + 1) % len(self.chunk_slots))
            values = self._current.pop(slot, None)
        if values is None:  # the same module ran twice within its chunk
            values = self.hooks[slot].materialize()
        return values

    def reset(self) -> None:
        """Drop everything held (the model's next forward reads afresh)."""
        with self._lock:
            if self._pending is not None:
                self._pending[1].result()
            self._pending = None
            self._current = {}
            self._current_chunk = -1

    def close(self) -> None:
        self.reset()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __del__(self) -> None:
        try:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
        except Exception:
            pass


def enable_prefetch(model: nn.Module, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> WeightPrefetcher | None:
    """Register every offloading hook of ``model``, in module order, with one new prefetcher."""
    from accel_bigmodel.hooks import AlignDevicesHook, SequentialHook

    prefetcher = WeightPrefetcher(chunk_bytes)
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
        for h in hooks:
            if isinstance(h, AlignDevicesHook) and h.offload and h._slots:
                nbytes = sum(s.placeholder.numel() * s.placeholder.element_size() for s in h._slots)
                prefetcher.register(h, nbytes)
    if not prefetcher.hooks:
        return None
    model._accel_prefetcher = prefetcher  # type: ignore[assignment]
    return prefetcher

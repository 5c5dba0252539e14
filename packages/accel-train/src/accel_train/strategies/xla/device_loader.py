"""The prepared data loader of an XLA run: the sharded loader, its batches sent to torch_xla's device.

Why not torch_xla's ``MpDeviceLoader``: it reads the loader ahead from background threads, so the
loader's own position (what ``save_state`` records and ``load_state`` resumes from) and its end-of-data
flag (what ``accumulate`` syncs on) would run several batches ahead of the batch in hand. This wrapper
reads one batch at a time, in the caller's thread: before each batch it cuts the pending graph (the
work of the previous step runs), then hands the batch over on the device. Everything else (``dataset``,
``batch_size``, ``state_dict``, ``set_epoch``, ...) is the sharded loader's own, reached through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["XLADeviceLoader"]


class XLADeviceLoader:
    """Iterate ``loader`` with a graph cut before each batch and each batch moved to ``device``.

    Args:
        loader: the sharded loader (`accel_data.DataLoaderShard` or `DataLoaderDispatcher`).
        device: torch_xla's device of this process.
        sync: the graph cut (``torch_xla.sync``), called before each batch is read.
        put_on_device: move batches to ``device`` (``False``: hand them over as the loader gives them).
    """

    def __init__(self, loader: Any, device: Any, sync: Callable[[], None], put_on_device: bool = True) -> None:
        self.__dict__["_loader"] = loader
        self.__dict__["device"] = device
        self.__dict__["_sync"] = sync
        self.__dict__["_put_on_device"] = put_on_device

    @property
    def base_dataloader(self) -> Any:
        """The sharded loader this one reads (where its position and sampler live)."""
        return self._loader

    def __iter__(self) -> Iterator[Any]:
        from accel_state.operations import send_to_device

        for batch in self._loader:
            self._sync()
            yield send_to_device(batch, self.device) if self._put_on_device else batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_loader"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ or name.startswith("_is_accelerate"):
            self.__dict__[name] = value
        else:
            setattr(self._loader, name, value)

    def __repr__(self) -> str:
        return f"XLADeviceLoader({self._loader!r}, device={self.device})"

"""``DataLoaderAdapter``: one object standing for a torch ``DataLoader`` or a torchdata
``StatefulDataLoader``, chosen at construction (the documented wrapper that code written for the
documented system subclasses or checks for)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from accel_data.config import require_stateful_dataloader


class DataLoaderAdapter:
    """Wraps a ``DataLoader`` (or, with ``use_stateful_dataloader``, a ``StatefulDataLoader``) built
    from the same arguments, and behaves as it: attribute access, iteration, ``len`` and
    ``isinstance(adapter, DataLoader)`` all reach the wrapped loader (``base_dataloader``)."""

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any):
        self.use_stateful_dataloader = use_stateful_dataloader
        if use_stateful_dataloader:
            require_stateful_dataloader()
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.base_dataloader: Any = StatefulDataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        else:
            self.base_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":  # not set yet (during unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.base_dataloader)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        """The wrapped loader's class, so ``isinstance(adapter, DataLoader)`` holds."""
        return self.base_dataloader.__class__

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's position (a ``StatefulDataLoader`` only)."""
        if not hasattr(self.base_dataloader, "state_dict"):
            raise AttributeError("state_dict needs use_stateful_dataloader=True (torchdata's StatefulDataLoader).")
        return dict(self.base_dataloader.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a position saved by `state_dict()`."""
        if not hasattr(self.base_dataloader, "load_state_dict"):
            raise AttributeError("load_state_dict needs use_stateful_dataloader=True.")
        self.base_dataloader.load_state_dict(state_dict)

"""DataLoaderAdapter stands for the loader it wraps (a DataLoader, or torchdata's StatefulDataLoader)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_data.data_loader import DataLoaderAdapter


def test_adapter_behaves_as_the_wrapped_dataloader() -> None:
    adapter = DataLoaderAdapter(TensorDataset(torch.arange(10)), batch_size=4)
    assert isinstance(adapter, DataLoader) and isinstance(adapter.base_dataloader, DataLoader)
    assert len(adapter) == 3 and adapter.batch_size == 4
    assert [batch[0].tolist() for batch in adapter] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(AttributeError, match="use_stateful_dataloader=True"):
        adapter.state_dict()


def test_stateful_adapter_saves_and_restores_its_position() -> None:
    pytest.importorskip("torchdata.stateful_dataloader")
    data = TensorDataset(torch.arange(12))
    adapter = DataLoaderAdapter(data, use_stateful_dataloader=True, batch_size=3)
    iterator = iter(adapter)
    next(iterator)
    state = adapter.state_dict()
    rest = [batch[0].tolist() for batch in iterator]
    resumed = DataLoaderAdapter(data, use_stateful_dataloader=True, batch_size=3)
    resumed.load_state_dict(state)
    assert [batch[0].tolist() for batch in resumed] == rest == [[3, 4, 5], [6, 7, 8], [9, 10, 11]]

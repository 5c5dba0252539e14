"""Errors carry the documented system's key phrase, so a pasted message finds the existing answers."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from accel_data.data_loader import prepare_data_loader
from accel_data.sharding import check_split


class Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(12))


def test_split_batch_not_divisible_says_round_multiple() -> None:
    phrase = "needs to be a round multiple of the number of processes"
    with pytest.raises(ValueError, match=phrase) as error:
        prepare_data_loader(
            DataLoader(torch.arange(12), batch_size=5), num_processes=2, process_index=0, split_batches=True
        )
    assert "Use a batch size that is a multiple of 2" in str(error.value)  # and still says what would work
    with pytest.raises(ValueError, match=phrase):
        prepare_data_loader(DataLoader(Stream(), batch_size=5), num_processes=2, process_index=0, split_batches=True)
    sampler = BatchSampler(SequentialSampler(range(12)), batch_size=5, drop_last=False)
    with pytest.raises(ValueError, match=phrase):
        prepare_data_loader(
            DataLoader(torch.arange(12), batch_sampler=sampler), num_processes=2, process_index=0, split_batches=True
        )
    with pytest.raises(ValueError, match=phrase + r"\. Use a batch size that is a multiple of 3 \(e\.g\. 6\)"):
        check_split(7, 3)


def test_dispatch_without_device_placement_says_requires_put_on_device() -> None:
    with pytest.raises(ValueError, match=r"Using `dispatch_batches=True` requires `put_on_device=True`"):
        prepare_data_loader(DataLoader(Stream(), batch_size=2), dispatch_batches=True, put_on_device=False)

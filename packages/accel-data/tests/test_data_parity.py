"""Behaviours scripts written for the documented system (release 1.15) rely on (issue 17)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from accel_data.data_loader import BatchSamplerShard, DataLoaderDispatcher, prepare_data_loader


class VaryingBatches(Sampler):
    """A batch sampler with no ``batch_size``: its batches differ in size."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches
        self.drop_last = False

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


def test_batch_sampler_without_batch_size_is_padded_with_its_first_batches() -> None:
    sampler = VaryingBatches([[0, 1], [2, 3, 4], [5], [6, 7, 8, 9], [10]])
    shards = [BatchSamplerShard(sampler, num_processes=3, process_index=p, even_batches=True) for p in range(3)]
    assert [list(s) for s in shards] == [[[0, 1], [6, 7, 8, 9]], [[2, 3, 4], [10]], [[5], [0, 1]]]
    assert [len(s) for s in shards] == [2, 2, 2]
    loader = prepare_data_loader(
        DataLoader(list(range(11)), batch_sampler=sampler), num_processes=2, process_index=1, put_on_device=False
    )
    assert [b.tolist() for b in loader] == [[2, 3, 4], [6, 7, 8, 9], [0, 1]]


class Records(IterableDataset):
    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(5):
            yield {"x": torch.tensor([float(i)]), "name": f"s{i}", "meta": {"id": i}}


def test_dispatched_loader_passes_non_tensor_leaves_through_on_one_process() -> None:
    loader = prepare_data_loader(DataLoader(Records(), batch_size=2), put_on_device=True)
    assert isinstance(loader, DataLoaderDispatcher)
    batches = list(loader)
    assert [b["name"] for b in batches] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    assert [b["meta"]["id"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert [b["x"].flatten().tolist() for b in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert loader.end_of_dataloader and loader.remainder == 0

    only_strings = prepare_data_loader(
        DataLoader(["a", "b", "c"], batch_size=2), dispatch_batches=True, put_on_device=True
    )
    assert list(only_strings) == [["a", "b"], ["c"]]


class EpochSampler(SequentialSampler):
    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class EpochBatchSampler(BatchSampler):
    def __init__(self, sampler: EpochSampler, batch_size: int) -> None:
        super().__init__(sampler, batch_size, drop_last=False)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)  # does not pass it on: the loader must


def test_set_epoch_reaches_the_batch_sampler_and_the_sampler_inside_it() -> None:
    sampler = EpochSampler(range(8))
    batch_sampler = EpochBatchSampler(sampler, batch_size=2)
    for processes in (1, 2):
        sampler.epochs.clear()
        batch_sampler.epochs.clear()
        loader = prepare_data_loader(
            DataLoader(range(8), batch_sampler=batch_sampler), num_processes=processes, process_index=0
        )
        loader.set_epoch(7)
        assert batch_sampler.epochs[-1] == 7
        assert sampler.epochs[-1] == 7


def test_prepared_loaders_expose_base_dataloader() -> None:
    sharded = prepare_data_loader(DataLoader(range(4), batch_size=2), num_processes=2, process_index=0)
    base = sharded.base_dataloader
    assert isinstance(base, DataLoader)
    assert len(base) == len(sharded) and base.batch_sampler is sharded.batch_sampler
    dispatched = prepare_data_loader(DataLoader(Records(), batch_size=2), put_on_device=True)
    assert isinstance(dispatched.base_dataloader, DataLoader)

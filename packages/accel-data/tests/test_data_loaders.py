"""Prepared loaders in one process: batches, types, device placement, GradientState, epochs, skipping."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from accel_data.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from accel_state.state import GradientState

Pair = namedtuple("Pair", ["x", "y"])


class Range(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([float(i)]), "i": torch.tensor(i)}


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))


class Batch:
    """A custom batch type with a ``to`` method, as users write them."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self.moved_to: list[Any] = []

    def to(self, device: Any, non_blocking: bool = False) -> Batch:
        self.moved_to.append(device)
        return self


def ids(batch: Any) -> list[int]:
    if isinstance(batch, dict):
        return batch["i"].tolist()
    if isinstance(batch, (list, tuple)):
        return batch[0].tolist()
    return batch.tolist()


def test_one_process_gives_the_same_batches_and_types_as_the_raw_loader() -> None:
    raw = DataLoader(Range(10), batch_size=3)
    prepared = prepare_data_loader(raw)
    assert isinstance(prepared, DataLoaderShard) and isinstance(prepared, DataLoader)
    assert [ids(b) for b in prepared] == [ids(b) for b in raw] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(prepared) == 4 and prepared.total_batch_size == 3 and prepared.total_dataset_length == 10
    assert prepared.dataset is raw.dataset and prepared.device is None

    pairs = TensorDataset(torch.arange(6), torch.arange(6) * 10)
    loader = prepare_data_loader(DataLoader(pairs, batch_size=4, collate_fn=lambda s: Pair(*map(torch.stack, zip(*s)))))
    batch = next(iter(loader))
    assert type(batch) is Pair and batch.y.tolist() == [0, 10, 20, 30]

    custom = prepare_data_loader(
        DataLoader(range(5), batch_size=2, collate_fn=lambda s: Batch(torch.tensor(s))),
        put_on_device=True,
        device="meta",
    )
    moved = list(custom)
    assert [b.ids.tolist() for b in moved] == [[0, 1], [2, 3], [4]]
    assert all(b.moved_to == [torch.device("meta")] for b in moved)


def test_put_on_device_moves_every_tensor_and_keeps_the_structure() -> None:
    loader = prepare_data_loader(DataLoader(Range(4), batch_size=2), put_on_device=True, device="meta")
    batches = list(loader)
    assert all(t.device.type == "meta" for b in batches for t in b.values())
    on_cpu = prepare_data_loader(
        DataLoader(Range(4), batch_size=2), put_on_device=True, device="cpu", non_blocking=True
    )
    assert [ids(b) for b in on_cpu] == [[0, 1], [2, 3]]
    assert on_cpu.device == torch.device("cpu")


def test_end_of_dataloader_is_known_while_the_last_batch_is_used() -> None:
    state = GradientState()
    loader = prepare_data_loader(DataLoader(Range(7), batch_size=3))
    seen = []
    assert not state.in_dataloader
    for _ in loader:
        seen.append((state.in_dataloader, state.end_of_dataloader, loader.end_of_dataloader, state.remainder))
    assert seen == [(True, False, False, 0), (True, False, False, 0), (True, True, True, 0)]
    assert not state.in_dataloader and state.active_dataloader is None

    # nested loaders: the inner one is active while it runs, then the outer one again
    outer = prepare_data_loader(DataLoader(Range(4), batch_size=2))
    inner = prepare_data_loader(DataLoader(Range(2), batch_size=1))
    for _ in outer:
        for _ in inner:
            assert state.active_dataloader is inner
        assert state.active_dataloader is outer
    # leaving a loop early unregisters the loader too
    for _ in outer:
        break
    assert not state.in_dataloader

    # a loader made before GradientState was reset still registers with the new one
    GradientState._reset_state()
    assert [state.in_dataloader for _ in outer] == [True, True] and not GradientState().in_dataloader

    empty = prepare_data_loader(DataLoader(Range(0), batch_size=2))
    assert list(empty) == [] and not state.in_dataloader


def test_simulated_processes_share_the_data_and_report_the_padding() -> None:
    per_process = [
        prepare_data_loader(DataLoader(Range(10), batch_size=2), num_processes=3, process_index=p) for p in range(3)
    ]
    assert all(isinstance(dl.batch_sampler, BatchSamplerShard) for dl in per_process)
    batches = [[ids(b) for b in dl] for dl in per_process]
    assert batches == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [0, 1]]]
    assert [len(dl) for dl in per_process] == [2, 2, 2]
    assert per_process[0].total_batch_size == 6
    remainders = []
    for dl in per_process:
        for _ in dl:
            remainders.append((dl.end_of_dataloader, dl.remainder))
    assert remainders[-1] == (True, 2)  # 12 samples read, 2 of them duplicates

    split = [
        prepare_data_loader(DataLoader(Range(10), batch_size=4), num_processes=2, process_index=p, split_batches=True)
        for p in range(2)
    ]
    assert [[ids(b) for b in dl] for dl in split] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]
    assert split[0].total_batch_size == 4
    uneven = [
        prepare_data_loader(DataLoader(Range(10), batch_size=4), num_processes=2, process_index=p, even_batches=False)
        for p in range(2)
    ]
    assert [[ids(b) for b in dl] for dl in uneven] == [[[0, 1, 2, 3], [8, 9]], [[4, 5, 6, 7]]]
    for dl in uneven:
        list(dl)
        assert dl.remainder == 0


def test_iterable_datasets_are_sharded_by_global_batch() -> None:
    shards = [
        prepare_data_loader(DataLoader(Stream(7), batch_size=2), num_processes=2, process_index=p) for p in range(2)
    ]
    assert all(isinstance(dl.dataset, IterableDatasetShard) for dl in shards)
    assert [[b.tolist() for b in dl] for dl in shards] == [[[0, 1], [4, 5]], [[2, 3], [6, 0]]]
    dropped = [
        prepare_data_loader(DataLoader(Stream(7), batch_size=2, drop_last=True), num_processes=2, process_index=p)
        for p in range(2)
    ]
    assert [[b.tolist() for b in dl] for dl in dropped] == [[[0, 1]], [[2, 3]]]
    split = [
        prepare_data_loader(DataLoader(Stream(6), batch_size=4), num_processes=2, process_index=p, split_batches=True)
        for p in range(2)
    ]
    assert [[b.tolist() for b in dl] for dl in split] == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]
    assert split[0].total_batch_size == 4 and shards[0].total_batch_size == 4
    assert shards[0].remainder == -1  # length of a plain iterable dataset is unknown


def test_workers_pin_memory_and_persistent_workers() -> None:
    raw = DataLoader(Range(9), batch_size=2, num_workers=2, pin_memory=False, persistent_workers=True)
    loader = prepare_data_loader(raw, num_processes=2, process_index=1)
    assert loader.num_workers == 2 and loader.persistent_workers
    first = [ids(b) for b in loader]
    assert first == [ids(b) for b in loader] == [[2, 3], [6, 7], [1, 2]]
    pinned = prepare_data_loader(DataLoader(Range(3), batch_size=2, pin_memory=True))
    assert [ids(b) for b in pinned] == [[0, 1], [2]]


class EpochSampler(SequentialSampler):
    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_set_epoch_reaches_the_sampler_and_counts_iterations() -> None:
    sampler = EpochSampler(range(4))
    loader = prepare_data_loader(DataLoader(range(4), batch_size=2, sampler=sampler), num_processes=2, process_index=0)
    list(loader)
    list(loader)
    assert sampler.epochs == [0, 1]
    loader.set_epoch(5)
    assert sampler.epochs[-1] == 5 and loader.iteration == 5
    list(loader)
    assert sampler.epochs[-1] == 5 and loader.iteration == 6

    class EpochData(Stream):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    data = EpochData(4)
    streamed = prepare_data_loader(DataLoader(data, batch_size=2), num_processes=2, process_index=0)
    streamed.set_epoch(3)
    assert data.epoch == 3


def test_seedable_sampler_orders_by_seed_and_epoch() -> None:
    def order(seed: int, epochs: int = 2) -> list[list[int]]:
        loader = prepare_data_loader(
            DataLoader(Range(12), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=seed
        )
        sampler = loader.batch_sampler.sampler
        assert isinstance(sampler, SeedableRandomSampler) and sampler.initial_seed == seed
        return [[i for b in loader for i in ids(b)] for _ in range(epochs)]

    a, b, c = order(7), order(7), order(8)
    assert a == b and a != c and a[0] != a[1]
    assert sorted(a[0]) == list(range(12))
    raw = DataLoader(Range(12), batch_size=4, shuffle=True)
    prepare_data_loader(raw, use_seedable_sampler=True, data_seed=1)
    assert type(raw.batch_sampler.sampler) is RandomSampler  # the user's loader is left as it was


def test_shuffled_processes_agree_on_the_permutation_when_seeded() -> None:
    def shard(p: int) -> list[int]:
        torch.manual_seed(3)
        loader = prepare_data_loader(
            DataLoader(Range(11), batch_size=2, shuffle=True), num_processes=2, process_index=p
        )
        return [i for b in loader for i in ids(b)]

    zero, one = shard(0), shard(1)
    assert set(zero) | set(one) == set(range(11)) and len(zero) == len(one) == 6


def test_skip_first_batches_keeps_sharding_device_and_epoch() -> None:
    loader = prepare_data_loader(
        DataLoader(Range(12), batch_size=2), num_processes=2, process_index=1, put_on_device=True, device="cpu"
    )
    skipped = skip_first_batches(loader, 1)
    assert isinstance(skipped, DataLoaderShard) and isinstance(skipped.batch_sampler, SkipBatchSampler)
    assert [ids(b) for b in skipped] == [[6, 7], [10, 11]] and len(skipped) == 2
    assert skipped.device == torch.device("cpu") and skipped.total_batch_size == 4

    loader.set_epoch(4)
    assert skip_first_batches(loader, 0).iteration == 4

    stream = prepare_data_loader(DataLoader(Stream(8), batch_size=2), num_processes=2, process_index=0)
    assert [b.tolist() for b in skip_first_batches(stream, 1)] == [[4, 5]]

    plain = skip_first_batches(DataLoader(Range(5), batch_size=2), 2)
    assert type(plain) is DataLoader and [ids(b) for b in plain] == [[4]]
    plain_stream = skip_first_batches(DataLoader(Stream(5), batch_size=2), 1)
    assert isinstance(plain_stream, SkipDataLoader) and [b.tolist() for b in plain_stream] == [[2, 3], [4]]

    as_sampler = DataLoader(
        TensorDataset(torch.arange(6)), sampler=BatchSampler(SequentialSampler(range(6)), 2, False), batch_size=None
    )
    fast = prepare_data_loader(as_sampler, num_processes=2, process_index=0)
    assert isinstance(fast.sampler, BatchSamplerShard)
    assert [ids(b) for b in skip_first_batches(fast, 1)] == [[4, 5]]


def test_skipped_batches_are_never_loaded_for_map_style_data() -> None:
    class Counting(Range):
        reads = 0

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            Counting.reads += 1
            return super().__getitem__(i)

    loader = skip_first_batches(prepare_data_loader(DataLoader(Counting(10), batch_size=2)), 3)
    assert [ids(b) for b in loader] == [[6, 7], [8, 9]]
    assert Counting.reads == 4


class NoSizeBatchSampler:
    """A batch sampler of the user's own, with varying batch sizes and no ``batch_size``."""

    def __iter__(self) -> Any:
        return iter([[0], [1, 2], [3, 4, 5], [6]])

    def __len__(self) -> int:
        return 4


def test_own_batch_sampler_without_batch_size() -> None:
    # even_batches (the default): the last round is completed with whole batches from the start
    even = [
        prepare_data_loader(DataLoader(Range(7), batch_sampler=NoSizeBatchSampler()), num_processes=2, process_index=p)
        for p in range(2)
    ]
    assert [[ids(b) for b in dl] for dl in even] == [[[0], [3, 4, 5]], [[1, 2], [6]]]
    loaders = [
        prepare_data_loader(
            DataLoader(Range(7), batch_sampler=NoSizeBatchSampler()),
            num_processes=2,
            process_index=p,
            even_batches=False,
        )
        for p in range(2)
    ]
    assert [[ids(b) for b in dl] for dl in loaders] == [[[0], [3, 4, 5]], [[1, 2], [6]]]
    with pytest.raises(ValueError, match=r"batch_size=None.*NoSizeBatchSampler.*split_batches=False"):
        prepare_data_loader(
            DataLoader(Range(7), batch_sampler=NoSizeBatchSampler()),
            num_processes=2,
            process_index=0,
            split_batches=True,
        )


def test_bad_input_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"batch of 6 samples in 4 equal slices.*multiple of 4.*split_batches=False"):
        prepare_data_loader(DataLoader(Range(8), batch_size=6), num_processes=4, process_index=0, split_batches=True)
    with pytest.raises(ValueError, match=r"6.*not a multiple of 4"):
        prepare_data_loader(DataLoader(Stream(8), batch_size=6), num_processes=4, process_index=0, split_batches=True)
    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(Range(4)), dispatch_batches=True)
    with pytest.raises(TypeError, match="needs a torch.utils.data.DataLoader, got list"):
        prepare_data_loader([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"process_index=2 is not in range\(num_processes=2\)"):
        prepare_data_loader(DataLoader(Range(4)), num_processes=2, process_index=2)
    with pytest.raises(ValueError, match=r"batch_size=None and no batch sampler.*Give it a batch_size"):
        prepare_data_loader(DataLoader(Range(4), batch_size=None), num_processes=2, process_index=0)
    unbatched = prepare_data_loader(DataLoader(Range(3), batch_size=None))  # one process: nothing to shard
    assert [b["i"].item() for b in unbatched] == [0, 1, 2]
    with pytest.raises(ValueError, match="num_batches must be an int >= 0, got -1"):
        skip_first_batches(DataLoader(Range(4)), -1)
    with pytest.raises(ValueError, match="skip_batches must be >= 0"):
        SkipBatchSampler(BatchSampler(SequentialSampler(range(3)), 1, False), -2)

    strings = DataLoader(["a", "b", "c", "d"], batch_size=2)
    dispatcher = prepare_data_loader(strings, put_on_device=True, dispatch_batches=True)
    assert isinstance(dispatcher, DataLoaderDispatcher)
    # One process: nothing is cut, the strings pass through (several processes refuse them, see
    # test_data_distributed.py, rather than give a wrong split).
    assert list(dispatcher) == [["a", "b"], ["c", "d"]]
    assert not GradientState().in_dataloader


def test_dispatcher_in_one_process_and_custom_slice_fn() -> None:
    loader = prepare_data_loader(DataLoader(Stream(5), batch_size=2), put_on_device=True)
    assert isinstance(loader, DataLoaderDispatcher)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert loader.remainder == 0 and loader.end_of_dataloader

    calls = []

    def keep_all(batch: Any, tensor_slice: slice, process_index: int = 0, num_processes: int = 1) -> Any:
        calls.append((tensor_slice, process_index, num_processes))
        return batch

    texts = prepare_data_loader(
        DataLoader([{"t": "a", "x": torch.tensor(1)}] * 3, batch_size=2),
        put_on_device=True,
        dispatch_batches=True,
        slice_fn_for_dispatch=keep_all,
    )
    out = list(texts)
    assert out[0]["t"] == ["a", "a"] and out[1]["x"].tolist() == [1]
    assert calls[0] == (slice(0, 2), 0, 1)
    assert len(texts) == 2 and texts.total_batch_size == 2
    assert [b.tolist() for b in skip_first_batches(loader, 2)] == [[4]]


def test_dataloader_configuration_is_validated() -> None:
    from accel_data.config import DataLoaderConfiguration

    config = DataLoaderConfiguration(split_batches=True, even_batches=False, data_seed=3, use_seedable_sampler=True)
    assert config.to_dict()["data_seed"] == 3 and config.dispatch_batches is None
    with pytest.raises(TypeError, match=r"split_batches must be True or False, got str \('yes'\)"):
        DataLoaderConfiguration(split_batches="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dispatch_batches must be True, False or None"):
        DataLoaderConfiguration(dispatch_batches=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"data_seed must be an int or None, got float"):
        DataLoaderConfiguration(data_seed=1.5)  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="only used with use_seedable_sampler=True"):
        DataLoaderConfiguration(data_seed=1)

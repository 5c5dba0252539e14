"""state_dict / load_state_dict: a resumed loader yields exactly what an uninterrupted one would have."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accel_data.data_loader import prepare_data_loader, skip_first_batches
from accel_state.imports import is_torchdata_stateful_dataloader_available
from accel_state.install_hints import install_hint

requires_torchdata = pytest.mark.skipif(
    not is_torchdata_stateful_dataloader_available(),
    reason=f"needs torchdata>=0.8: {install_hint('accel-data', 'torchdata')}",
)

EPOCHS = 3
pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")


class Squares(Dataset):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": torch.tensor(i), "sq": torch.tensor(i * i)}


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(9))


CONFIGS: dict[str, dict[str, Any]] = {
    "shuffled": {"data": "map", "shuffle": True},
    "sharded-shuffled": {"data": "map", "shuffle": True, "num_processes": 2, "process_index": 1},
    "split": {"data": "map", "shuffle": True, "num_processes": 2, "process_index": 0, "split_batches": True},
    "seedable": {"data": "map", "shuffle": True, "use_seedable_sampler": True, "data_seed": 5},
    "workers": {"data": "map", "shuffle": True, "num_workers": 2},
    "iterable": {"data": "stream", "num_processes": 2, "process_index": 0},
    "dispatched": {"data": "stream", "put_on_device": True},
    "dispatched-map": {"data": "map", "shuffle": True, "put_on_device": True, "dispatch_batches": True},
}


def build(config: dict[str, Any], stateful: bool, seed: int) -> DataLoader:
    torch.manual_seed(seed)
    options = dict(config)
    data = options.pop("data")
    shuffle = options.pop("shuffle", False)
    workers = options.pop("num_workers", 0)
    dataset = Squares() if data == "map" else Stream()
    raw = DataLoader(dataset, batch_size=2, shuffle=shuffle, num_workers=workers)
    return prepare_data_loader(raw, use_stateful_dataloader=stateful, **options)


def flat(batch: Any) -> list[int]:
    return (batch["i"] if isinstance(batch, dict) else batch).tolist()


def plain_types_only(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_types_only(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain_types_only(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.Tensor))


def uninterrupted(config: dict[str, Any], stateful: bool) -> list[tuple[int, list[int]]]:
    loader = build(config, stateful, seed=0)
    return [(epoch, flat(b)) for epoch in range(EPOCHS) for b in loader]


def interrupted(config: dict[str, Any], stateful: bool, stop_epoch: int, stop_at: int) -> list[tuple[int, list[int]]]:
    """Read until batch ``stop_at`` of ``stop_epoch`` (-1: after that epoch), save, resume in a fresh loader."""
    loader = build(config, stateful, seed=0)
    seen: list[tuple[int, list[int]]] = []
    state = None
    for epoch in range(stop_epoch + 1):
        for step, batch in enumerate(loader):
            seen.append((epoch, flat(batch)))
            if epoch == stop_epoch and step == stop_at:
                state = loader.state_dict()
                break
    if state is None:
        state = loader.state_dict()
    assert plain_types_only(state), state
    fresh = build(config, stateful, seed=1234)  # different RNG: the state must bring back the order
    fresh.load_state_dict(state)
    assert fresh.state_dict()["batches_yielded"] == state["batches_yielded"]
    start = stop_epoch if stop_at >= 0 else stop_epoch + 1
    for epoch in range(start, EPOCHS):
        seen.extend((epoch, flat(b)) for b in fresh)
    return seen


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize(
    "stateful", [False, pytest.param(True, marks=requires_torchdata)], ids=["own-state", "torchdata"]
)
def test_resume_mid_epoch_between_epochs_and_on_the_last_batch(name: str, stateful: bool) -> None:
    config = CONFIGS[name]
    expected = uninterrupted(config, stateful)
    per_epoch = len([e for e, _ in expected if e == 0])
    assert (per_epoch >= 2 and expected[:per_epoch] != expected[per_epoch : 2 * per_epoch]) or "shuffle" not in config
    for stop_epoch, stop_at in ((1, 0), (1, per_epoch - 2), (1, per_epoch - 1), (0, -1), (0, 0)):
        assert interrupted(config, stateful, stop_epoch, stop_at) == expected, (name, stop_epoch, stop_at)


def test_state_after_leaving_a_loop_early_keeps_the_position() -> None:
    # one process: the order comes from torch's global generator when iterating, as with torch's own loader
    expected = [flat(b) for b in build(CONFIGS["shuffled"], False, seed=0)]
    loader = build(CONFIGS["shuffled"], False, seed=0)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_yielded"] == 3
    fresh = build(CONFIGS["shuffled"], False, seed=99)
    fresh.load_state_dict(state)
    assert [flat(b) for b in fresh] == expected[3:]


def test_skip_first_batches_matches_the_resumed_position() -> None:
    whole = [flat(b) for b in build(CONFIGS["sharded-shuffled"], False, seed=0)]
    loader = build(CONFIGS["sharded-shuffled"], False, seed=0)
    assert [flat(b) for b in skip_first_batches(loader, 2)] == whole[2:]


def test_load_state_dict_rejects_foreign_states() -> None:
    loader = build(CONFIGS["shuffled"], False, seed=0)
    with pytest.raises(KeyError, match=r"no \['batches_yielded', 'generator_states'\]"):
        loader.load_state_dict({"epoch": 1})
    other = build(CONFIGS["iterable"], False, seed=0)
    with pytest.raises(ValueError, match=r"holds 0 generator state\(s\) but this loader has 1"):
        loader.load_state_dict(other.state_dict())
    if is_torchdata_stateful_dataloader_available():
        stateful = build(CONFIGS["shuffled"], True, seed=0)
        with pytest.raises(KeyError, match="no 'stateful' entry"):
            stateful.load_state_dict(loader.state_dict())


def test_stateful_opt_in_works_without_torchdata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchdata, use_stateful_dataloader=True is accel's own position (no ImportError)."""
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    from accel_data.config import DataLoaderConfiguration
    from accel_data.loaders import DataLoaderShard
    from accel_state import imports

    monkeypatch.setattr(imports, "is_torchdata_stateful_dataloader_available", lambda: False)
    assert DataLoaderConfiguration(use_stateful_dataloader=True).use_stateful_dataloader
    loader = prepare_data_loader(DataLoader(Squares(), batch_size=2), use_stateful_dataloader=True)
    assert loader.use_stateful_dataloader and not isinstance(loader, StatefulDataLoader)
    assert "stateful" not in loader.state_dict()
    shard = DataLoaderShard(Squares(), use_stateful_dataloader=True)
    assert shard.use_stateful_dataloader and not isinstance(shard, StatefulDataLoader)


@requires_torchdata
def test_stateful_loaders_are_torchdata_stateful_dataloaders() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from accel_data.data_loader import DataLoaderDispatcher, DataLoaderShard

    shard = build(CONFIGS["shuffled"], True, seed=0)
    assert (
        isinstance(shard, StatefulDataLoader) and isinstance(shard, DataLoaderShard) and shard.use_stateful_dataloader
    )
    dispatcher = build(CONFIGS["dispatched"], True, seed=0)
    assert isinstance(dispatcher, StatefulDataLoader) and isinstance(dispatcher, DataLoaderDispatcher)
    assert "stateful" in shard.state_dict()
    assert not build(CONFIGS["shuffled"], False, seed=0).use_stateful_dataloader


@pytest.mark.parametrize("name", ["sharded-shuffled", "iterable", "dispatched", "seedable"])
def test_documented_load_then_skip_first_batches_workflow(name: str) -> None:
    """load_state, then skip_first_batches for the rest of the epoch, then back to the prepared loader."""
    config = CONFIGS[name]
    expected = uninterrupted(config, False)
    loader = build(config, False, seed=0)
    seen = [(0, flat(b)) for b in loader]
    for step, batch in enumerate(loader):
        seen.append((1, flat(batch)))
        if step == 1:
            state = loader.state_dict()
            break
    assert state["batches_yielded"] == 2
    prepared = build(config, False, seed=77)
    prepared.load_state_dict(state)
    skipped = skip_first_batches(prepared, state["batches_yielded"])
    for step, batch in enumerate(skipped):
        seen.append((1, flat(batch)))
        if step == 0:
            # a checkpoint taken now, on the prepared loader, points after 3 batches of epoch 1
            mid = prepared.state_dict()
            assert (mid["epoch"], mid["batches_yielded"]) == (1, 3)
    assert prepared.iteration == 2  # the skipping loader finished epoch 1 for it
    seen.extend((2, flat(b)) for b in prepared)
    assert seen == expected

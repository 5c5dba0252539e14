"""What ``Accelerator.load_state`` does with a saved loader position (``load_checkpoint_state``).

As documented: without an opt-in the loader stays as it was prepared (its next iteration is a new
epoch whose order comes from torch's restored random state) and the script skips what it already used
(``skip_first_batches`` or a ``continue``). With ``use_stateful_dataloader=True`` the loader continues
at the saved batch (torchdata or accel's own state). With accel's ``replay_epoch_on_resume=True`` the
interrupted epoch replays from its first batch, in the same order, so the script's own skip is exact.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accel_data.data_loader import prepare_data_loader, skip_first_batches
from accel_data.loaders import load_checkpoint_state
from accel_state.imports import is_torchdata_stateful_dataloader_available

pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")
SAVED_AT = 2  # batches of epoch 1 used before the checkpoint


class Squares(Dataset):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": torch.tensor(i)}


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(9))


CONFIGS: dict[str, dict[str, Any]] = {
    "shuffled": {"data": "map", "shuffle": True},
    "sharded-shuffled": {"data": "map", "shuffle": True, "num_processes": 2, "process_index": 1},
    "seedable": {"data": "map", "shuffle": True, "use_seedable_sampler": True, "data_seed": 3},
    "iterable": {"data": "stream", "num_processes": 2, "process_index": 0},
    "dispatched": {"data": "stream", "put_on_device": True},
}


def build(config: dict[str, Any], stateful: bool, seed: int, replay: bool = False) -> DataLoader:
    torch.manual_seed(seed)
    options = dict(config)
    dataset = Squares() if options.pop("data") == "map" else Stream()
    raw = DataLoader(dataset, batch_size=2, shuffle=options.pop("shuffle", False))
    return prepare_data_loader(raw, use_stateful_dataloader=stateful, replay_epoch_on_resume=replay, **options)


def flat(batch: Any) -> list[int]:
    return (batch["i"] if isinstance(batch, dict) else batch).tolist()


def checkpoint_in_epoch_1(
    config: dict[str, Any], stateful: bool, replay: bool = False
) -> tuple[list[list[int]], dict[str, Any]]:
    """Epoch 1 as an uninterrupted run reads it, and the state saved after ``SAVED_AT`` of its batches."""
    loader = build(config, stateful, seed=0, replay=replay)
    for _ in loader:  # epoch 0
        pass
    epoch_1 = []
    state = None
    for step, batch in enumerate(loader):
        epoch_1.append(flat(batch))
        if step == SAVED_AT - 1:
            state = loader.state_dict()
    assert state is not None and state["batches_yielded"] == SAVED_AT
    return epoch_1, state


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_default_leaves_the_loader_as_prepared(name: str) -> None:
    """As in the documented system: no epoch, order or position comes back; the loader reads what a
    freshly prepared one reads after the same random state."""
    _, state = checkpoint_in_epoch_1(CONFIGS[name], stateful=False)
    resumed = build(CONFIGS[name], False, seed=1234)
    fresh = build(CONFIGS[name], False, seed=1234)
    torch.manual_seed(5)
    load_checkpoint_state(resumed, state)
    assert resumed.iteration == 0 and resumed.state_dict()["batches_yielded"] == 0
    read = [flat(b) for b in resumed]
    torch.manual_seed(5)
    assert read == [flat(b) for b in fresh]


def test_default_skip_first_batches_does_not_advance_the_loaders_epoch() -> None:
    """As in the documented system, a loader skipped from keeps its own epoch count (a seedable sampler
    then reads the order of that epoch again); the opt-ins continue at the next epoch."""
    for replay, expected in ((False, 0), (True, 1)):
        loader = build(CONFIGS["seedable"], False, seed=0, replay=replay)
        for _ in skip_first_batches(loader, 2):
            pass
        assert loader.iteration == expected, replay


def test_the_two_opt_ins_together_are_refused() -> None:
    raw = DataLoader(Squares(), batch_size=2)
    with pytest.raises(ValueError, match="use_stateful_dataloader=True and replay_epoch_on_resume=True"):
        prepare_data_loader(raw, use_stateful_dataloader=True, replay_epoch_on_resume=True)
    from accel_data import DataLoaderConfiguration

    with pytest.raises(ValueError, match="cannot be combined"):
        DataLoaderConfiguration(use_stateful_dataloader=True, replay_epoch_on_resume=True)
    with pytest.raises(TypeError, match="replay_epoch_on_resume must be True or False"):
        DataLoaderConfiguration(replay_epoch_on_resume="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_replay_opt_in_replays_the_epoch_and_both_manual_skips_resume_exactly(name: str) -> None:
    epoch_1, state = checkpoint_in_epoch_1(CONFIGS[name], stateful=False, replay=True)

    replayed = build(CONFIGS[name], False, seed=1234, replay=True)  # another RNG: the state brings back the order
    load_checkpoint_state(replayed, state)
    assert replayed.iteration == 1 and replayed.state_dict()["batches_yielded"] == 0
    continued = []
    for step, batch in enumerate(replayed):  # the documented `continue` over the first n steps
        if step < SAVED_AT:
            continue
        continued.append(flat(batch))
    assert continued == epoch_1[SAVED_AT:]

    skipped_from = build(CONFIGS[name], False, seed=99, replay=True)
    load_checkpoint_state(skipped_from, state)
    skipped = [flat(b) for b in skip_first_batches(skipped_from, SAVED_AT)]
    assert skipped == epoch_1[SAVED_AT:]


def test_replay_opt_in_reads_the_whole_epoch_in_the_saved_order() -> None:
    epoch_1, state = checkpoint_in_epoch_1(CONFIGS["shuffled"], stateful=False, replay=True)
    replayed = build(CONFIGS["shuffled"], False, seed=5, replay=True)
    load_checkpoint_state(replayed, state)
    assert [flat(b) for b in replayed] == epoch_1
    assert replayed.iteration == 2  # and the next epoch is the one after the saved one


@pytest.mark.parametrize("name", ["shuffled", "sharded-shuffled", "seedable"])
def test_replay_opt_in_leaves_the_global_generator_as_the_uninterrupted_run(name: str) -> None:
    """The replayed iterator does not draw from torch's generator again: later random numbers stay in
    step (a one-process loader with the opt-in shuffles with a generator of its own)."""
    _, state = checkpoint_in_epoch_1(CONFIGS[name], stateful=False, replay=True)
    torch.manual_seed(7)
    expected = torch.rand(3)
    replayed = build(CONFIGS[name], False, seed=5, replay=True)
    load_checkpoint_state(replayed, state)
    torch.manual_seed(7)
    iterator = iter(replayed)
    next(iterator)
    assert torch.equal(torch.rand(3), expected)


def _opt_in_cases() -> list[Any]:
    torchdata = pytest.param(
        "torchdata",
        marks=pytest.mark.skipif(not is_torchdata_stateful_dataloader_available(), reason="needs torchdata>=0.8"),
    )
    return ["own-state", torchdata]


@pytest.mark.parametrize("backing", _opt_in_cases())
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_opt_in_continues_at_the_saved_batch(name: str, backing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backing == "own-state":
        from accel_state import imports

        monkeypatch.setattr(imports, "is_torchdata_stateful_dataloader_available", lambda: False)
    epoch_1, state = checkpoint_in_epoch_1(CONFIGS[name], stateful=True)
    resumed = build(CONFIGS[name], True, seed=1234)
    assert resumed.use_stateful_dataloader
    load_checkpoint_state(resumed, state)
    assert [flat(b) for b in resumed] == epoch_1[SAVED_AT:]


def test_objects_that_are_not_prepared_loaders_get_the_state_as_it_is() -> None:
    class Counter:
        def __init__(self) -> None:
            self.loaded: dict[str, Any] = {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.loaded = state

    counter = Counter()
    load_checkpoint_state(counter, {"batches_yielded": 4})
    assert counter.loaded == {"batches_yielded": 4}


@pytest.mark.parametrize("backing", _opt_in_cases())
@pytest.mark.parametrize("read", [1, 3])
def test_rewound_state_reads_the_last_batch_again(read: int, backing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint taken when a step starts (preemption) resumes at that step's batch."""
    if backing == "own-state":
        from accel_state import imports

        monkeypatch.setattr(imports, "is_torchdata_stateful_dataloader_available", lambda: False)
    whole = [flat(b) for b in build(CONFIGS["shuffled"], True, seed=0)]
    loader = build(CONFIGS["shuffled"], True, seed=0)
    for step, _ in enumerate(loader):
        if step == read - 1:
            state = loader.rewound_state_dict()
            break
    assert state["batches_yielded"] == read - 1
    resumed = build(CONFIGS["shuffled"], True, seed=8)
    load_checkpoint_state(resumed, state)
    assert [flat(b) for b in resumed] == whole[read - 1 :]

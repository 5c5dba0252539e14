"""One process, shuffled: a prepared loader draws the same order as torch's own loader with the same
seed, and leaves torch's global generator where torch's loader leaves it (as the documented system,
which seeds a sampler of its own only when the batches are sharded over several processes)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from accel_data.data_loader import prepare_data_loader
from accel_data.samplers import GeneratorOwner, generator_owner


def _epochs(loader: DataLoader, count: int) -> tuple[list[list[int]], torch.Tensor]:
    order = [[int(i) for i in batch] for _ in range(count) for batch in loader]
    return order, torch.rand(3)  # the next draw from the global generator


def test_one_process_shuffle_equals_torch_and_keeps_the_global_generator_in_step() -> None:
    torch.manual_seed(7)
    plain = _epochs(DataLoader(torch.arange(9), batch_size=2, shuffle=True), 3)
    torch.manual_seed(7)
    prepared = _epochs(prepare_data_loader(DataLoader(torch.arange(9), batch_size=2, shuffle=True)), 3)
    assert prepared[0] == plain[0]
    assert torch.equal(prepared[1], plain[1])
    assert plain[0][:5] != plain[0][5:10]  # each epoch shuffled anew


def test_two_shards_still_share_one_order() -> None:
    torch.manual_seed(3)
    first = [
        b.tolist()
        for b in prepare_data_loader(
            DataLoader(torch.arange(8), batch_size=2, shuffle=True), num_processes=2, process_index=0
        )
    ]
    torch.manual_seed(3)
    second = [
        b.tolist()
        for b in prepare_data_loader(
            DataLoader(torch.arange(8), batch_size=2, shuffle=True), num_processes=2, process_index=1
        )
    ]
    assert sorted(i for batch in first + second for i in batch) == list(range(8))


_S, _L, _G = GeneratorOwner.SAMPLER, GeneratorOwner.LOADER, GeneratorOwner.GLOBAL


@pytest.mark.parametrize(
    ("has_generator", "sharded", "resumable", "owner"),
    [
        (False, False, False, _G),  # one process: torch's global generator, as torch's own loader
        (False, True, False, _L),
        (False, False, True, _L),
        (False, True, True, _L),
        (True, False, False, _S),  # the user's generator is always kept
        (True, True, False, _S),
        (True, False, True, _S),
        (True, True, True, _S),
    ],
)
def test_the_generator_ownership_rule(has_generator: bool, sharded: bool, resumable: bool, owner) -> None:
    assert generator_owner(has_generator=has_generator, sharded=sharded, resumable=resumable) is owner


def test_the_prepared_samplers_follow_the_ownership_rule() -> None:
    one = prepare_data_loader(DataLoader(torch.arange(9), batch_size=2, shuffle=True))
    resumable = prepare_data_loader(
        DataLoader(torch.arange(9), batch_size=2, shuffle=True), use_stateful_dataloader=True
    )
    assert one.batch_sampler.sampler.generator is None and one._draws_from_global_generator()
    assert isinstance(resumable.batch_sampler.sampler.generator, torch.Generator)
    assert not resumable._draws_from_global_generator()

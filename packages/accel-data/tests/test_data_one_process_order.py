"""One process, shuffled: a prepared loader draws the same order as torch's own loader with the same
seed, and leaves torch's global generator where torch's loader leaves it (as the documented system,
which seeds a sampler of its own only when the batches are sharded over several processes)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from accel_data.data_loader import prepare_data_loader


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

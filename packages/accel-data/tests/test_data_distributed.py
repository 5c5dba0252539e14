"""Prepared loaders on two real gloo processes: sharding, dispatching, iterable data, skipping, resuming."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accel_state.testing import DistributedPool

pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"i": torch.tensor(i), "x": torch.full((3,), float(i))}


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class Ragged(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(i + 1)


def _ids(batch: Any) -> torch.Tensor:
    return batch["i"] if isinstance(batch, dict) else batch


def _gather_for_metrics(loader: Any) -> list[int]:
    """Gather every step over the processes and drop the padding at the end, as the Accelerator does."""
    from accel_state.operations import gather

    out: list[int] = []
    for batch in loader:
        gathered = gather(_ids(batch).contiguous())
        if loader.end_of_dataloader and loader.remainder > 0:
            gathered = gathered[: loader.remainder]
        out.extend(gathered.tolist())
    return out


def shard_cases() -> dict[str, Any]:
    from accel_data.data_loader import prepare_data_loader
    from accel_state.operations import gather_object
    from accel_state.state import PartialState

    state = PartialState()
    results: dict[str, Any] = {"rank": state.process_index}
    shuffled = prepare_data_loader(
        DataLoader(Numbers(13), batch_size=2, shuffle=True), put_on_device=True, rng_types=["generator"]
    )
    results["shuffled_lengths"] = len(shuffled)
    results["shuffled_mine"] = [[_ids(b).tolist() for b in shuffled] for _ in range(2)]
    results["shuffled_metrics"] = _gather_for_metrics(shuffled)
    results["total_batch_size"] = shuffled.total_batch_size
    split = prepare_data_loader(DataLoader(Numbers(10), batch_size=4), split_batches=True)
    results["split_metrics"] = _gather_for_metrics(split)
    results["split_mine"] = [_ids(b).tolist() for b in split]
    uneven = prepare_data_loader(DataLoader(Numbers(5), batch_size=2), even_batches=False)
    results["uneven"] = gather_object([_ids(b).tolist() for b in uneven])
    results["uneven_len"] = len(uneven)
    stream = prepare_data_loader(DataLoader(Stream(11), batch_size=2))
    results["stream_mine"] = [b.tolist() for b in stream]
    results["stream_len"] = len(stream)
    results["stream_metrics"] = _gather_for_metrics(stream)
    seeded = prepare_data_loader(
        DataLoader(Numbers(8), batch_size=2, shuffle=True), use_seedable_sampler=True, data_seed=11
    )
    results["seeded"] = gather_object([_ids(b).tolist() for b in seeded])
    # no data_seed and a different seed on each process: process 0's initial seed is used everywhere
    torch.manual_seed(1000 + state.process_index)
    unseeded = prepare_data_loader(DataLoader(Numbers(8), batch_size=2, shuffle=True), use_seedable_sampler=True)
    results["unseeded"] = gather_object([_ids(b).tolist() for b in unseeded])
    # the user's own generator, seeded differently on each process: synchronised from process 0 each epoch
    own = torch.Generator().manual_seed(100 + state.process_index)
    synced = prepare_data_loader(
        DataLoader(Numbers(10), batch_size=2, shuffle=True, generator=own), rng_types=["generator"]
    )
    results["synced"] = [gather_object([i for b in synced for i in _ids(b).tolist()]) for _ in range(2)]
    return results


def test_sharded_loaders_on_two_processes(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(shard_cases)
    assert r0["shuffled_metrics"] == r1["shuffled_metrics"]
    assert sorted(r0["shuffled_metrics"]) == list(range(13))
    for epoch in range(2):
        mine0 = [i for b in r0["shuffled_mine"][epoch] for i in b]
        mine1 = [i for b in r1["shuffled_mine"][epoch] for i in b]
        assert set(mine0) | set(mine1) == set(range(13)) and len(mine0) == len(mine1) == 8
    assert r0["shuffled_mine"][0] != r0["shuffled_mine"][1]  # reshuffled each epoch, the same way everywhere
    assert r0["shuffled_lengths"] == 4 and r0["total_batch_size"] == 4
    assert r0["split_metrics"] == list(range(10))
    assert r0["split_mine"] == [[0, 1], [4, 5], [8, 9]] and r1["split_mine"] == [[2, 3], [6, 7], [0, 1]]
    assert r0["uneven"] == [[0, 1], [4], [2, 3]] and (r0["uneven_len"], r1["uneven_len"]) == (2, 1)
    assert r0["stream_mine"] == [[0, 1], [4, 5], [8, 9]] and r1["stream_mine"] == [[2, 3], [6, 7], [10, 0]]
    assert r0["stream_len"] == 3 and r0["stream_metrics"] == list(range(11))
    assert sorted(i for b in r0["seeded"] for i in b) == list(range(8))
    assert sorted(i for b in r0["unseeded"] for i in b) == list(range(8))
    for epoch in range(2):
        both = r0["synced"][epoch]
        assert set(both) == set(range(10)) and len(both) == 12 and both == r1["synced"][epoch]
    assert r0["synced"][0] != r0["synced"][1]


def dispatch_cases() -> dict[str, Any]:
    from accel_data.data_loader import DataLoaderDispatcher, prepare_data_loader
    from accel_state import kept_works

    results: dict[str, Any] = {}
    stream = prepare_data_loader(DataLoader(Stream(11), batch_size=2), put_on_device=True)
    assert isinstance(stream, DataLoaderDispatcher)
    kept_works.pin_kept_works()  # an empty queue: what follows is the dispatcher's alone
    results["stream"] = [b.tolist() for b in stream]
    # the batches' broadcasts are kept referenced, so no gloo thread frees them at exit (issue 37)
    results["kept_by_dispatch"] = kept_works.kept_works()
    results["stream_len"] = len(stream)
    results["stream_metrics"] = _gather_for_metrics(stream)
    split = prepare_data_loader(DataLoader(Stream(7), batch_size=4), put_on_device=True, split_batches=True)
    results["split"] = [b.tolist() for b in split]
    results["split_metrics"] = _gather_for_metrics(split)
    mapped = prepare_data_loader(
        DataLoader(Numbers(9), batch_size=2, shuffle=True), put_on_device=True, dispatch_batches=True
    )
    results["mapped_metrics"] = _gather_for_metrics(mapped)
    dropped = prepare_data_loader(DataLoader(Stream(11), batch_size=2, drop_last=True), put_on_device=True)
    results["dropped"] = [b.tolist() for b in dropped]
    errors = {}
    strings = prepare_data_loader(
        DataLoader(["a", "b", "c", "d"], batch_size=2), put_on_device=True, dispatch_batches=True
    )
    try:
        list(strings)
    except ValueError as error:
        errors["strings"] = str(error)
    ragged = prepare_data_loader(DataLoader(Ragged(), batch_size=1), put_on_device=True, dispatch_batches=True)
    try:
        list(ragged)
    except ValueError as error:
        errors["ragged"] = str(error)
    results["errors"] = errors
    # the pool is still usable after those errors: nothing is left half-sent
    results["after"] = [
        b.tolist() for b in prepare_data_loader(DataLoader(Stream(4), batch_size=2), put_on_device=True)
    ]
    return results


def test_dispatched_loaders_on_two_processes(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(dispatch_cases)
    assert r0["stream"] == [[0, 1], [4, 5], [8, 9]] and r1["stream"] == [[2, 3], [6, 7], [10, 0]]
    assert r0["stream_len"] == 3
    assert r0["kept_by_dispatch"] > 0 and r1["kept_by_dispatch"] > 0
    assert r0["stream_metrics"] == r1["stream_metrics"] == list(range(11))
    assert r0["split"] == [[0, 1], [4, 5]] and r1["split"] == [[2, 3], [6, 0]]
    assert r0["split_metrics"] == list(range(7))
    assert sorted(r0["mapped_metrics"]) == list(range(9)) and r0["mapped_metrics"] == r1["mapped_metrics"]
    assert r0["dropped"] == [[0, 1], [4, 5]] and r1["dropped"] == [[2, 3], [6, 7]]
    for rank in (r0, r1):
        assert "batch[0] is a str ('a')" in rank["errors"]["strings"]
        assert "dispatch_batches=False" in rank["errors"]["strings"]
        assert "cannot be joined" in rank["errors"]["ragged"] and "split_batches=True" in rank["errors"]["ragged"]
    assert r0["after"] == [[0, 1]] and r1["after"] == [[2, 3]]


def _run_with_resume(make: Any, stop_epoch: int, stop_step: int, epochs: int = 2) -> tuple[list[Any], list[Any]]:
    """Batches of an uninterrupted run, and of a run saved at (stop_epoch, stop_step) and resumed anew."""
    torch.manual_seed(0)
    reference = make()
    whole = [(e, _ids(b).tolist()) for e in range(epochs) for b in reference]
    torch.manual_seed(0)
    loader = make()
    seen, state = [], None
    for epoch in range(stop_epoch + 1):
        for step, batch in enumerate(loader):
            seen.append((epoch, _ids(batch).tolist()))
            if epoch == stop_epoch and step == stop_step:
                state = loader.state_dict()
                break
    torch.manual_seed(1000 + stop_step)
    fresh = make()
    fresh.load_state_dict(state)
    for epoch in range(stop_epoch, epochs):
        seen.extend((epoch, _ids(b).tolist()) for b in fresh)
    return whole, seen


def _load_then_skip(make: Any) -> bool:
    """The documented workflow: load_state, skip_first_batches for the epoch's rest, then the loader again."""
    from accel_data.data_loader import skip_first_batches

    torch.manual_seed(0)
    reference = make()
    whole = [(e, _ids(b).tolist()) for e in range(2) for b in reference]
    torch.manual_seed(0)
    loader = make()
    seen, state = [], None
    for step, batch in enumerate(loader):
        seen.append((0, _ids(batch).tolist()))
        if step == 1:
            state = loader.state_dict()
            break
    torch.manual_seed(5)
    fresh = make()
    fresh.load_state_dict(state)
    seen.extend((0, _ids(b).tolist()) for b in skip_first_batches(fresh, state["batches_yielded"]))
    seen.extend((1, _ids(b).tolist()) for b in fresh)
    return seen == whole


def skip_and_resume_cases() -> dict[str, Any]:
    from accel_data.data_loader import prepare_data_loader, skip_first_batches

    results: dict[str, Any] = {}
    loader = prepare_data_loader(DataLoader(Numbers(12), batch_size=2), put_on_device=True)
    results["skipped"] = [_ids(b).tolist() for b in skip_first_batches(loader, 1)]
    stream = prepare_data_loader(DataLoader(Stream(12), batch_size=2), put_on_device=True)
    results["skipped_dispatch"] = [b.tolist() for b in skip_first_batches(stream, 1)]
    sharded_stream = prepare_data_loader(DataLoader(Stream(12), batch_size=2), dispatch_batches=False)
    results["skipped_stream"] = [b.tolist() for b in skip_first_batches(sharded_stream, 2)]

    makers = {
        "shard": lambda stateful: prepare_data_loader(
            DataLoader(Numbers(13), batch_size=2, shuffle=True),
            rng_types=["generator"],
            use_stateful_dataloader=stateful,
        ),
        "dispatch": lambda stateful: prepare_data_loader(
            DataLoader(Stream(13), batch_size=2), put_on_device=True, use_stateful_dataloader=stateful
        ),
        "iterable": lambda stateful: prepare_data_loader(
            DataLoader(Stream(13), batch_size=2), dispatch_batches=False, use_stateful_dataloader=stateful
        ),
    }
    from accel_state.imports import is_torchdata_stateful_dataloader_available

    modes = (False, True) if is_torchdata_stateful_dataloader_available() else (False,)
    for name, make in makers.items():
        results[f"{name}-workflow-skip"] = _load_then_skip(lambda make=make: make(False))
        for stateful in modes:
            for stop in (0, 2):
                whole, resumed = _run_with_resume(lambda make=make, stateful=stateful: make(stateful), 1, stop)
                results[f"{name}-{stateful}-{stop}"] = whole == resumed
    return results


def test_skip_and_resume_on_two_processes(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(skip_and_resume_cases)
    assert r0["skipped"] == [[4, 5], [8, 9]] and r1["skipped"] == [[6, 7], [10, 11]]
    assert r0["skipped_dispatch"] == [[4, 5], [8, 9]] and r1["skipped_dispatch"] == [[6, 7], [10, 11]]
    assert r0["skipped_stream"] == [[8, 9]] and r1["skipped_stream"] == [[10, 11]]
    for rank in (r0, r1):
        failed = [key for key, ok in rank.items() if key.count("-") == 2 and not ok]
        assert not failed, failed


def mesh_cases() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    from accel_data.data_loader import prepare_data_loader

    out: dict[str, Any] = {}
    for shape in ((1, 2), (2, 1)):
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
        loader = prepare_data_loader(DataLoader(Numbers(8), batch_size=2), torch_device_mesh=mesh)
        out[str(shape)] = [_ids(b).tolist() for b in loader]
        dispatched = prepare_data_loader(
            DataLoader(Stream(8), batch_size=2), put_on_device=True, torch_device_mesh=mesh
        )
        out[f"dispatch{shape}"] = [b.tolist() for b in dispatched]
    return out


def test_tensor_parallel_ranks_read_the_same_batches(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(mesh_cases)
    assert r0["(1, 2)"] == r1["(1, 2)"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert r0["(2, 1)"] == [[0, 1], [4, 5]] and r1["(2, 1)"] == [[2, 3], [6, 7]]
    assert r0["dispatch(1, 2)"] == r1["dispatch(1, 2)"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert r0["dispatch(2, 1)"] == [[0, 1], [4, 5]] and r1["dispatch(2, 1)"] == [[2, 3], [6, 7]]

"""The sharding arithmetic, checked for every small case against an independent statement of the rules."""

from __future__ import annotations

import itertools
import math

import pytest

from accel_data import sharding


def sampler_batches(length: int, batch_size: int, drop_last: bool) -> list[list[int]]:
    """What ``BatchSampler(SequentialSampler(range(length)), batch_size, drop_last)`` yields."""
    batches = [list(range(start, min(start + batch_size, length))) for start in range(0, length, batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def expected(length: int, bs: int, n: int, split: bool, even: bool, drop_last: bool) -> list[list[list[int]]]:
    """The documented rules, written as a padded sample stream cut into chunks."""
    data = list(range(length))
    out: list[list[list[int]]] = [[] for _ in range(n)]
    if length == 0:
        return out
    if split:
        width = bs // n
        full = length // bs
        chunks = [data[k * bs : (k + 1) * bs] for k in range(full)]
        rest = data[full * bs :]
        if rest and not drop_last:
            if even:
                head = data[:bs]
                rest = rest + [head[k % len(head)] for k in range(bs - len(rest))]
            chunks.append(rest)
        for chunk in chunks:
            for p in range(n):
                piece = chunk[p * width : (p + 1) * width]
                if piece:
                    out[p].append(piece)
        return out
    batches = math.ceil(length / bs) if not drop_last else length // bs
    if drop_last:
        rounds = batches // n
        for k in range(rounds * n):
            out[k % n].append(data[k * bs : (k + 1) * bs])
        return out
    if not even:
        for k in range(batches):
            out[k % n].append(data[k * bs : (k + 1) * bs])
        return out
    rounds = math.ceil(batches / n)
    total = rounds * n * bs
    head = data[: min(length, n * bs)]
    stream = data + [head[k % len(head)] for k in range(total - length)]
    for k in range(rounds * n):
        out[k % n].append(stream[k * bs : (k + 1) * bs])
    return out


def gather_for_metrics(per_process: list[list[list[int]]], padded: int) -> list[int]:
    """Concatenate step by step over processes (as ``gather`` does), then drop the padding at the end."""
    gathered: list[int] = []
    steps = max((len(b) for b in per_process), default=0)
    for step in range(steps):
        for batches in per_process:
            if step < len(batches):
                gathered.extend(batches[step])
    return gathered[: len(gathered) - padded] if padded else gathered


CASES = [
    (length, bs, n, split, even, drop_last)
    for length, bs, n in itertools.product(range(51), range(1, 9), range(1, 5))
    for split, even, drop_last in itertools.product((False, True), repeat=3)
]


def test_every_small_case_follows_the_rules() -> None:
    checked = 0
    for length, bs, n, split, even, drop_last in CASES:
        if split and bs % n:
            with pytest.raises(ValueError, match="multiple of the number of processes"):
                list(sharding.shard_batches([], batch_size=bs, num_processes=n, process_index=0, split_batches=True))
            continue
        batches = sampler_batches(length, bs, drop_last)
        got = [
            list(
                sharding.shard_batches(
                    batches,
                    batch_size=bs,
                    num_processes=n,
                    process_index=p,
                    split_batches=split,
                    even_batches=even,
                    drop_last=drop_last,
                )
            )
            for p in range(n)
        ]
        case = f"length={length} bs={bs} n={n} split={split} even={even} drop_last={drop_last}"
        assert got == expected(length, bs, n, split, even, drop_last), case
        last = len(batches[-1]) if batches else None
        for p in range(n):
            assert sharding.shard_length(
                len(batches),
                num_processes=n,
                process_index=p,
                split_batches=split,
                even_batches=even,
                drop_last=drop_last,
                last_batch_size=(length % bs) if batches else None,
                batch_size=bs,
            ) == len(got[p]), case
        if even and not drop_last:
            # every process gets as many batches, all full
            assert len({len(b) for b in got}) <= 1, case
            per_process = bs // n if split else bs
            assert all(len(batch) == per_process for b in got for batch in b), case
        padded = sharding.padded_samples(
            length, batch_size=bs, num_processes=n, split_batches=split, even_batches=even, drop_last=drop_last
        )
        seen = [i for b in got for batch in b for i in batch]
        assert set(seen) == set(range(length)) or drop_last, case
        assert len(seen) - padded == len(set(seen)) or not (even and not drop_last) or len(seen) == 0, case
        if not (even and not drop_last):
            assert len(seen) == len(set(seen)), case  # duplicates only where even_batches pads
        result = gather_for_metrics(got, padded)
        if drop_last:
            assert result == list(range(len(result))), case
            kept = (length // bs) * bs if split else (length // bs // n) * n * bs
            assert len(result) == kept, case
        else:
            assert result == list(range(length)), case
        assert last is None or last <= bs
        checked += 1
    assert checked == sum(1 for c in CASES if not (c[3] and c[1] % c[2]))


def test_iterable_sharding_every_small_case() -> None:
    for length, bs, n, split, drop_last in itertools.product(
        range(41), range(1, 7), range(1, 5), (False, True), (False, True)
    ):
        if split and bs % n:
            with pytest.raises(ValueError, match="not a multiple"):
                list(
                    sharding.shard_iterable(
                        range(length), batch_size=bs, num_processes=n, process_index=0, split_batches=True
                    )
                )
            continue
        per = bs // n if split else bs
        glob = bs if split else bs * n
        got = [
            list(
                sharding.shard_iterable(
                    iter(range(length)),
                    batch_size=bs,
                    num_processes=n,
                    process_index=p,
                    split_batches=split,
                    drop_last=drop_last,
                )
            )
            for p in range(n)
        ]
        case = f"length={length} bs={bs} n={n} split={split} drop_last={drop_last}"
        size = sharding.iterable_shard_length(
            length, batch_size=bs, num_processes=n, split_batches=split, drop_last=drop_last
        )
        assert all(len(g) == size for g in got), case
        # Interleave per step (each process yields `per` samples a step) as gather would.
        gathered = [
            x for step in range(size // per if per else 0) for g in got for x in g[step * per : (step + 1) * per]
        ]
        padded = 0 if drop_last else (-length) % glob
        kept = gathered[: len(gathered) - padded] if padded else gathered
        if drop_last:
            assert kept == list(range((length // glob) * glob)), case
        else:
            assert kept == list(range(length)), case
            first = list(range(min(length, glob)))
            assert all(x in first for x in gathered[len(gathered) - padded :]), case


def test_dispatch_slices_cover_the_batch_once_plus_padding() -> None:
    for observed, n in itertools.product(range(1, 30), range(1, 5)):
        for drop_last in (False, True):
            slices = [sharding.dispatch_slice(observed, n, p, drop_last) for p in range(n)]
            paddings = {pad for _, pad in slices}
            assert len(paddings) == 1
            padding = paddings.pop()
            taken = [i for s, _ in slices for i in range(observed + padding)[s]]
            if drop_last:
                assert padding == 0 and taken == list(range(observed // n * n))
            else:
                assert taken == list(range(observed + padding)) and padding == (-observed) % n


def test_split_and_even_errors_name_the_values_and_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"batch size 6 is not a multiple of the number of processes \(4\).*split_batches=False"
    ):
        sharding.check_split(6, 4)
    with pytest.raises(ValueError, match="no `batch_size`"):
        sharding.check_split(None, 2)
    # without even_batches a batch sampler of varying batch sizes is dealt round-robin as is
    got = list(
        sharding.shard_batches(
            [[0], [1, 2], [3, 4, 5]], batch_size=None, num_processes=2, process_index=0, even_batches=False
        )
    )
    assert got == [[0], [3, 4, 5]]


def test_drawn_order_matches_iterating_torch_samplers() -> None:
    """BatchSamplerShard draws a torch sampler's whole order at once: it must be the order iterating gives."""
    import torch
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    from accel_data.samplers import BatchSamplerShard, SeedableRandomSampler, _drawable

    def samplers(length: int, seed: int) -> list:
        data = range(length)
        return [
            SequentialSampler(data),
            RandomSampler(data, generator=torch.Generator().manual_seed(seed)),
            RandomSampler(data, num_samples=length * 2 + 3, generator=torch.Generator().manual_seed(seed)),
            SeedableRandomSampler(data, data_seed=seed),
        ]

    for length, bs, n, drop_last, split in itertools.product(
        (1, 7, 16, 23), (1, 4), (1, 2, 3), (False, True), (False, True)
    ):
        if split and bs % n:
            continue
        for kind in range(4):
            fast_sampler, slow_sampler = samplers(length, 5)[kind], samplers(length, 5)[kind]
            fast = BatchSamplerShard(BatchSampler(fast_sampler, bs, drop_last), n, n - 1, split_batches=split)
            assert _drawable(fast.batch_sampler)
            got = [list(fast), list(fast)]  # two epochs: the generators must advance alike
            expected_epochs = []
            for _ in range(2):
                expected_epochs.append(
                    list(
                        sharding.shard_batches(
                            iter(BatchSampler(slow_sampler, bs, drop_last)),
                            batch_size=bs,
                            num_processes=n,
                            process_index=n - 1,
                            split_batches=split,
                            drop_last=drop_last,
                        )
                    )
                )
            assert got == expected_epochs, (length, bs, n, drop_last, split, kind)
            if kind == 3:
                assert fast_sampler.epoch == slow_sampler.epoch == 2


def test_varying_batches_with_even_batches_complete_the_round_with_whole_first_batches() -> None:
    """Release 1.15: a batch sampler without batch_size is padded by cycling its first batches."""
    batches = [[0], [1, 2], [3], [4, 5], [6]]

    def shards(data: list[list[int]], n: int, drop_last: bool = False) -> list[list[list[int]]]:
        return [
            list(sharding.shard_batches(data, batch_size=None, num_processes=n, process_index=p, drop_last=drop_last))
            for p in range(n)
        ]

    assert shards(batches, 4) == [[[0], [6]], [[1, 2], [0]], [[3], [1, 2]], [[4, 5], [3]]]
    assert shards(batches, 5) == [[[0]], [[1, 2]], [[3]], [[4, 5]], [[6]]]
    assert shards(batches, 4, drop_last=True) == [[[0]], [[1, 2]], [[3]], [[4, 5]]]
    # fewer batches than missing places: the first ones come round again
    assert shards([[0], [1, 2]], 5) == [[[0]], [[1, 2]], [[0]], [[1, 2]], [[0]]]
    for n in (2, 3, 4, 5):
        lengths = {len(shard) for shard in shards(batches, n)}
        assert lengths == {sharding.shard_length(len(batches), num_processes=n, process_index=0)}

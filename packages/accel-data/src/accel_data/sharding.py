"""Pure sharding arithmetic: which indices or samples each process gets, and how many are padding.

No torch, no processes: `BatchSamplerShard` and
`IterableDatasetShard` iterate through these generators, and the tests
check them exhaustively in-process.

The rules (the documented behaviour of the data loaders):

* **not split** (``split_batches=False``): the batches of the original sampler are dealt round-robin,
  batch ``k`` going to process ``k % num_processes``; a process only yields once every process of the
  round has a full batch.
* **split** (``split_batches=True``): each batch of the original sampler is cut in ``num_processes``
  equal slices, process ``i`` taking slice ``i``.
* The end of the data: with ``drop_last`` an incomplete round (or batch) is dropped; with
  ``even_batches`` it is completed with samples taken cyclically from the start of the data so that
  every process gets the same number of full batches (when the batch sampler has no ``batch_size``,
  its batches varying in size, the round is completed with whole batches from the start, cycling);
  otherwise processes may get fewer or shorter batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def check_split(batch_size: int | None, num_processes: int) -> None:
    """Raise if ``batch_size`` cannot be split evenly across ``num_processes`` processes."""
    if batch_size is None:
        raise ValueError(
            "split_batches=True needs a batch size to split, but the batch sampler has no `batch_size` "
            "attribute; give it one, or use split_batches=False."
        )
    if batch_size % num_processes != 0:
        raise ValueError(
            f"split_batches=True cuts each batch in {num_processes} equal slices, but the batch size "
            f"{batch_size} is not a multiple of the number of processes ({num_processes}): it needs to be a round "
            f"multiple of the number of processes. Use a batch size "
            f"that is a multiple of {num_processes} (e.g. {max(num_processes, batch_size // num_processes * num_processes)}), "
            "or split_batches=False to give each process whole batches."
        )


def _cycled(head: Sequence[T], count: int, start: int = 0) -> list[T]:
    """``count`` items of ``head`` repeated endlessly, starting at position ``start``."""
    if count <= 0 or not head:
        return []
    n = len(head)
    return [head[(start + k) % n] for k in range(count)]


def shard_batches(
    batches: Iterable[Sequence[T]],
    *,
    batch_size: int | None,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
) -> Iterator[list[T]]:
    """The batches of ``batches`` (lists of indices) that process ``process_index`` gets."""
    if split_batches:
        check_split(batch_size, num_processes)
        return _split(batches, batch_size, num_processes, process_index, even_batches, drop_last)
    return _deal(batches, batch_size, num_processes, process_index, even_batches, drop_last)


def _split(
    batches: Iterable[Sequence[T]],
    batch_size: int | None,
    num_processes: int,
    process_index: int,
    even_batches: bool,
    drop_last: bool,
) -> Iterator[list[T]]:
    assert batch_size is not None
    width = batch_size // num_processes
    lo, hi = width * process_index, width * (process_index + 1)
    first: list[T] = []
    last: list[T] = []
    for batch in batches:
        batch = batch if type(batch) is list else list(batch)
        if not first:
            first = batch
        if len(batch) == batch_size:
            yield batch[lo:hi]
            last = []
        else:
            last = batch
    if drop_last or not last:
        return
    if even_batches:
        last = last + _cycled(first, batch_size - len(last))
    if len(last) > lo:
        yield last[lo:hi]


def _deal(
    batches: Iterable[Sequence[T]],
    batch_size: int | None,
    num_processes: int,
    process_index: int,
    even_batches: bool,
    drop_last: bool,
) -> Iterator[list[T]]:
    head: list[T] = []  # the samples of the first round, to complete the last one
    first_batches: list[list[T]] = []  # the same, batch by batch, when batches vary in size
    mine: list[T] = []
    last: list[T] = []
    count = 0
    for position, batch in enumerate(batches):
        batch = batch if type(batch) is list else list(batch)
        count = position + 1
        last = batch
        if position < num_processes and even_batches and not drop_last:
            head.extend(batch)
            first_batches.append(batch)
        if position % num_processes == process_index:
            mine = batch
        if position % num_processes == num_processes - 1 and (batch_size is None or len(batch) == batch_size):
            yield mine
            mine = []
    if count == 0 or drop_last:
        return
    if not even_batches:
        if mine:
            yield mine
        return
    if batch_size is None:
        # Batches of varying size: complete the last round with whole batches from the start, cycling.
        left = count % num_processes
        if left == 0:
            return
        if process_index < left:
            yield mine
        else:
            yield first_batches[(process_index - left) % len(first_batches)]
        return
    if len(mine) == batch_size:
        yield mine
    # Complete the round: first the partial last batch (if any), then whole batches, from ``head``.
    position = count if len(last) == batch_size else count - 1
    partial = [] if len(last) == batch_size else last
    cursor = 0
    while position % num_processes != 0 or partial:
        need = batch_size - len(partial)
        filled = partial + _cycled(head, need, cursor)
        cursor += need
        if position % num_processes == process_index:
            yield filled
        partial = []
        position += 1


def shard_length(
    num_batches: int,
    *,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    last_batch_size: int | None = None,
    batch_size: int | None = None,
) -> int:
    """How many batches `shard_batches()` yields for a sampler of ``num_batches`` batches.

    ``last_batch_size`` (size of the sampler's last batch, when known) makes the count exact for
    ``split_batches`` without ``even_batches``, where trailing processes may get nothing.
    """
    if split_batches:
        if (
            not even_batches
            and not drop_last
            and num_batches > 0
            and last_batch_size is not None
            and batch_size is not None
            and 0 < last_batch_size < batch_size
        ):
            width = batch_size // num_processes
            return num_batches - 1 + (1 if last_batch_size > width * process_index else 0)
        return num_batches
    full_rounds, left = divmod(num_batches, num_processes)
    if left == 0 or drop_last:
        return full_rounds
    if even_batches:
        return full_rounds + 1
    return full_rounds + (1 if process_index < left else 0)


def padded_samples(
    dataset_length: int,
    *,
    batch_size: int,
    num_processes: int,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
) -> int:
    """Number of duplicated samples that complete the last global batch (what metrics must drop)."""
    if drop_last or not even_batches or dataset_length <= 0:
        return 0
    total = batch_size if split_batches else batch_size * num_processes
    return (-dataset_length) % total


def shard_iterable(
    samples: Iterable[T],
    *,
    batch_size: int,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    drop_last: bool = False,
) -> Iterator[T]:
    """The samples of an iterable dataset that process ``process_index`` reads.

    Samples are grouped in global batches (``batch_size``, or ``batch_size * num_processes`` when not
    splitting); each process takes its contiguous slice of every global batch. Without ``drop_last`` the
    last global batch is completed with samples from the first one.
    """
    if split_batches:
        check_split(batch_size, num_processes)
        per_process = batch_size // num_processes
        global_size = batch_size
    else:
        per_process = batch_size
        global_size = batch_size * num_processes
    lo, hi = per_process * process_index, per_process * (process_index + 1)
    first: list[T] | None = None
    current: list[T] = []
    for sample in samples:
        current.append(sample)
        if len(current) == global_size:
            yield from current[lo:hi]
            if first is None:
                first = current
            current = []
    if drop_last or not current:
        return
    source = first if first is not None else list(current)
    current = current + _cycled(source, global_size - len(current))
    yield from current[lo:hi]


def iterable_shard_length(
    dataset_length: int,
    *,
    batch_size: int,
    num_processes: int,
    split_batches: bool = False,
    drop_last: bool = False,
) -> int:
    """Number of samples `shard_iterable()` yields to each process for ``dataset_length`` samples."""
    if split_batches:
        per_process, global_size = batch_size // num_processes, batch_size
    else:
        per_process, global_size = batch_size, batch_size * num_processes
    rounds = dataset_length // global_size if drop_last else math.ceil(dataset_length / global_size)
    return rounds * per_process


def dispatch_slice(observed: int, num_processes: int, process_index: int, drop_last: bool) -> tuple[slice, int]:
    """Slice of a dispatched global batch of ``observed`` samples for one process, and the padding.

    The padding is how many samples (taken from the first batch) must be appended to the global batch
    first so that it splits evenly; it is 0 unless this is an uneven last batch without ``drop_last``.
    """
    per_process, left = divmod(observed, num_processes)
    padding = 0
    if left and not drop_last:
        per_process += 1
        padding = per_process * num_processes - observed
    return slice(per_process * process_index, per_process * (process_index + 1)), padding


def describe_leaf(path: str, value: Any) -> str:
    """A short description of ``value`` at ``path`` for error messages."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{path} is a {type(value).__name__} ({text})"

"""Samplers and datasets that shard, skip or reseed the data of a ``DataLoader``."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler

from accel_data import sharding


class GeneratorOwner(enum.Enum):
    """Who holds the generator a random sampler shuffles with (see `generator_owner()`)."""

    #: the sampler's own generator (the user's, or one a prepared loader gave it)
    SAMPLER = "sampler"
    #: none yet: the prepared loader gives the sampler one, seeded alike on every process
    LOADER = "loader"
    #: torch's global generator, drawn from at each epoch (the documented one-process behaviour)
    GLOBAL = "global"


def generator_owner(*, has_generator: bool, sharded: bool, resumable: bool) -> GeneratorOwner:
    """The generator-ownership rule of a ``RandomSampler`` in a prepared data loader.

    A sampler with a generator keeps it. One without shuffles each epoch from torch's global
    generator, as in the documented system (the same seed gives the same batches and every later
    random draw stays in step), unless the loader is sharded over processes or opted in to resuming
    exactly: then the loader gives it a generator of its own, so that every process
    shuffles alike and a saved position replays exactly.

    ``prepare_data_loader`` asks it of the user's sampler; a prepared loader asks it of its own
    sampler with ``sharded=False, resumable=False``, since by then a sampler that was to get a
    generator holds one (a loader built directly keeps its sampler as it was given).

    Args:
        has_generator: the sampler has a ``generator`` of its own.
        sharded: the loader shards the data over processes (several processes, not dispatching).
        resumable: the loader opted in to resuming exactly (``use_stateful_dataloader=True``, or accel's
            ``replay_epoch_on_resume=True``).

    Returns:
        ``SAMPLER``, ``LOADER`` (the loader is to give the sampler a generator) or ``GLOBAL``.
    """
    if has_generator:
        return GeneratorOwner.SAMPLER
    if sharded or resumable:
        return GeneratorOwner.LOADER
    return GeneratorOwner.GLOBAL


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose permutation depends only on a seed and the epoch.

    Every process that builds it with the same ``data_seed`` (or after the same ``set_seed``) shuffles
    the same way, and epoch ``e`` always gives the same order, which makes resuming exact.

    Args:
        *args: Positional arguments of `torch.utils.data.RandomSampler` (the data source first).
        data_seed: The seed of the permutation; `None` draws one from torch's default generator once.
        **kwargs: Keyword arguments of `RandomSampler` (`replacement`, `num_samples`, `generator`).
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = int(data_seed if data_seed is not None else torch.random.initial_seed())
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` for the next iteration.

        Args:
            epoch: The epoch number; it seeds the shuffling of that epoch.
        """
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """The seed and epoch of the permutation, to resume it."""
        return {"initial_seed": self.initial_seed, "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the seed and epoch saved by `state_dict`.

        Args:
            state_dict: A dict returned by `state_dict()`.
        """
        self.initial_seed = int(state_dict["initial_seed"])
        self.epoch = int(state_dict["epoch"])


class BatchSamplerShard(BatchSampler):
    """The batches of ``batch_sampler`` that belong to process ``process_index`` of ``num_processes``.

    Args:
        batch_sampler: the batch sampler to shard (anything yielding lists of indices).
        num_processes: number of processes reading the data.
        process_index: this process.
        split_batches: cut every batch in ``num_processes`` slices (the batch size is then the global
            one) instead of dealing whole batches round-robin.
        even_batches: complete the last round with samples from the start so every process gets the same
            number of batches of the same size (the padding is reported as ``remainder``); a batch sampler
            without ``batch_size`` (batches of varying size) gets whole batches from the start instead.

    ``drop_last`` is read from ``batch_sampler``: with it, an incomplete last round is dropped.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index={process_index} is not in range(num_processes={num_processes})")
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches:
            sharding.check_split(batch_size, num_processes)
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = batch_size  # type: ignore[assignment]
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:  # type: ignore[override]
        """The sampler of indices under the wrapped batch sampler."""
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped batch sampler, over all processes."""
        return len(self.batch_sampler)

    def _last_batch_size(self) -> int | None:
        sampler = self.sampler
        if sampler is None or self.batch_size is None:
            return None
        try:
            return len(sampler) % self.batch_size
        except TypeError:
            return None

    def __len__(self) -> int:
        return sharding.shard_length(
            len(self.batch_sampler),
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
            last_batch_size=self._last_batch_size(),
            batch_size=self.batch_size,
        )

    def __iter__(self) -> Iterator[list[int]]:
        if _drawable(self.batch_sampler):
            return self._iter_drawn()
        return sharding.shard_batches(
            self.batch_sampler,
            batch_size=self.batch_size,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
        )

    def _iter_drawn(self) -> Iterator[list[int]]:
        """Same batches as iterating the batch sampler, with the whole order drawn at once.

        Every process walks the indices of every batch to find its own; drawing the permutation as one
        list and slicing it avoids a Python step per index (most of the cost of sharding).
        """
        inner = self.batch_sampler
        indices = _draw(inner.sampler)
        size = inner.batch_size
        stop = len(indices) - size + 1 if inner.drop_last else len(indices)
        batches = (indices[start : start + size] for start in range(0, max(stop, 0), size))
        yield from sharding.shard_batches(
            batches,
            batch_size=self.batch_size,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
        )
        if isinstance(inner.sampler, SeedableRandomSampler):
            inner.sampler.set_epoch(inner.sampler.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to the wrapped batch sampler and its sampler (a new shuffle each epoch).

        Args:
            epoch: The epoch number; it seeds the shuffling of that epoch.
        """
        set_epoch_on(self.batch_sampler, epoch)


def _drawable(batch_sampler: Any) -> bool:
    """True for torch's own ``BatchSampler`` over a sampler whose whole order `_draw()` can compute."""
    if type(batch_sampler) is not BatchSampler or not isinstance(batch_sampler.batch_size, int):
        return False
    sampler: Any = batch_sampler.sampler
    if type(sampler) is SequentialSampler:
        return True
    return type(sampler) in (RandomSampler, SeedableRandomSampler) and not sampler.replacement


def _draw(sampler: Any) -> list[int]:
    """The indices ``sampler`` would yield, drawing from its generator exactly as its ``__iter__`` does."""
    if type(sampler) is SequentialSampler:
        return list(range(len(sampler.data_source)))
    if isinstance(sampler, SeedableRandomSampler):
        if sampler.generator is None:
            sampler.generator = torch.Generator()
        sampler.generator.manual_seed(sampler.initial_seed + sampler.epoch)
    n = len(sampler.data_source)
    generator = sampler.generator
    if generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    indices: list[int] = []
    for _ in range(sampler.num_samples // n):
        indices.extend(torch.randperm(n, generator=generator).tolist())
    indices.extend(torch.randperm(n, generator=generator).tolist()[: sampler.num_samples % n])
    return indices


class IterableDatasetShard(IterableDataset):
    """The samples of an iterable dataset that belong to one process (see `sharding.shard_iterable()`).

    Args:
        dataset: the iterable dataset.
        batch_size: batch size of each process (or the global one with ``split_batches``).
        drop_last: drop the incomplete last global batch instead of completing it from the start.
        num_processes / process_index: the processes and this one.
        split_batches: ``batch_size`` is the global batch size, cut in ``num_processes`` slices.
        num_processes: Number of processes that share the dataset.
        process_index: Index of this process among them.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches:
            sharding.check_split(batch_size, num_processes)
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index={process_index} is not in range(num_processes={num_processes})")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to the dataset when it has `set_epoch` (a new shuffle each epoch).

        Args:
            epoch: The epoch number; it seeds the shuffling of that epoch.
        """
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def total_length(self) -> int:
        """Number of samples of the dataset, over all processes."""
        return len(self.dataset)

    def __len__(self) -> int:
        return sharding.iterable_shard_length(
            len(self.dataset),
            batch_size=self.batch_size,
            num_processes=self.num_processes,
            split_batches=self.split_batches,
            drop_last=self.drop_last,
        )

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        return sharding.shard_iterable(
            self.dataset,
            batch_size=self.batch_size,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            drop_last=self.drop_last,
        )


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip_batches`` batches (the indices are never loaded).

    Args:
        batch_sampler: The batch sampler to skip into.
        skip_batches: How many of its first batches to drop.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:  # type: ignore[override]
        """The sampler of indices under the wrapped batch sampler."""
        return getattr(self.batch_sampler, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped batch sampler, skipped ones included."""
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to the wrapped batch sampler.

        Args:
            epoch: The epoch number; it seeds the shuffling of that epoch.
        """
        set_epoch_on(self.batch_sampler, epoch)


def epoch_targets(sampler: Any) -> list[Any]:
    """Every object with ``set_epoch`` along the chain from ``sampler`` inwards (through ``batch_sampler``
    and ``sampler`` attributes), outermost first; accel's own shard wrappers only pass it on."""
    targets: list[Any] = []
    seen: set[int] = set()
    node = sampler
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        method = getattr(type(node), "set_epoch", None)
        if method is not None and not isinstance(node, (BatchSamplerShard, SkipBatchSampler)):
            targets.append(node)
        inner = getattr(node, "batch_sampler", None)
        node = inner if inner is not None else getattr(node, "sampler", None)
    return targets


def set_epoch_on(sampler: Any, epoch: int) -> bool:
    """Call ``set_epoch`` on ``sampler`` and on every batch sampler and sampler inside it that has one
    (a custom batch sampler and the sampler it wraps both hear of the new epoch); True if any did."""
    targets = epoch_targets(sampler)
    for target in targets:
        target.set_epoch(epoch)
    return bool(targets)


def find_generators(*roots: Any) -> list[torch.Generator]:
    """Every ``torch.Generator`` reachable from samplers, batch samplers and datasets (no duplicates)."""
    found: list[torch.Generator] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, torch.Generator):
            found.append(node)
            continue
        for attr in ("generator", "batch_sampler", "sampler", "dataset"):
            child = getattr(node, attr, None) if not isinstance(node, (list, tuple, dict, torch.Tensor)) else None
            if child is not None:
                stack.append(child)
    return found

"""``DataLoaderShard`` and ``SkipDataLoader``, and the bookkeeping every prepared loader shares.

A prepared loader is a ``DataLoader`` subclass (or, with ``use_stateful_dataloader=True`` and torchdata
installed, a subclass of torchdata's ``StatefulDataLoader`` too). While iterating it registers with
``GradientState``, reads one batch ahead so that ``end_of_dataloader`` is already True while the last
batch is used, and counts the batches it yields, so ``state_dict()`` / ``load_state_dict()`` resume
mid-epoch.

``Accelerator.load_state`` restores that position only for loaders that opted in with
``use_stateful_dataloader=True`` (`load_checkpoint_state()`). The others stay as they were prepared,
as in the documented system, so a script that skips the seen batches itself (``skip_first_batches`` or
a ``continue``) does not skip them twice; with accel's ``replay_epoch_on_resume=True`` they get back
their epoch and shuffle order and replay the epoch from its start, so that such a skip resumes exactly.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accel_data.samplers import (
    BatchSamplerShard,
    GeneratorOwner,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    find_generators,
    generator_owner,
    set_epoch_on,
)

_STATE_KEYS = ("epoch", "batches_yielded", "generator_states")


@functools.cache
def _stateful_variant(cls: type) -> type:
    """``cls`` re-based on torchdata's ``StatefulDataLoader`` (cached: one class per loader class)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    variant = type(cls.__name__, (cls, StatefulDataLoader), {"__module__": cls.__module__, "_stateful": True})
    variant.__qualname__ = f"{cls.__qualname__}[StatefulDataLoader]"
    return variant


class _Progress:
    """Batches yielded in the current epoch; a slotted object, so counting skips ``DataLoader.__setattr__``."""

    __slots__ = ("yielded",)

    def __init__(self) -> None:
        self.yielded = 0


class _SkippableIndexSampler:
    """The loader's index sampler, able to skip its first batches once (after ``load_state_dict``)."""

    __slots__ = ("inner", "owner")

    def __init__(self, owner: Any, inner: Any) -> None:
        self.owner = owner
        self.inner = inner

    def __iter__(self) -> Iterator[Any]:
        if not self.owner._index_skip:
            return iter(self.inner)  # the usual case: no extra layer per batch
        # DataLoader iterators may call iter() more than once before reading: skip in the one that reads.
        return self._skipping()

    def _skipping(self) -> Iterator[Any]:
        skip = self.owner._index_skip
        self.owner._index_skip = 0
        yield from itertools.islice(iter(self.inner), skip, None)

    def __len__(self) -> int:
        return len(self.inner)


def _all_on(batch: Any, device: torch.device) -> bool:
    """True when every tensor in ``batch`` already lives on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.device == device
    if isinstance(batch, dict):
        return all(_all_on(value, device) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return all(_all_on(value, device) for value in batch)
    return not callable(getattr(batch, "to", None))


class DataLoaderStateMixin:
    """Epoch, position, ``GradientState`` registration and resume state of a prepared loader."""

    _stateful = False
    _position_opt_in = False
    replay_epoch_on_resume = False  # set by prepare_data_loader (accel's opt-in, see load_checkpoint_state)

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        from accel_state import imports

        if use_stateful_dataloader and not cls._stateful and imports.is_torchdata_stateful_dataloader_available():
            cls = _stateful_variant(cls)  # type: ignore[arg-type]
        loader = object.__new__(cls)
        # Without torchdata the opt-in still resumes at the saved position, through accel's own state.
        loader._position_opt_in = bool(use_stateful_dataloader)
        return loader

    def _init_state(
        self, rng_types: Any, synchronized_generator: Any, skip_batches: int, drop_last: bool, non_blocking: bool
    ) -> None:
        from accel_state.state import GradientState

        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.rng_types = list(rng_types) if rng_types is not None else None
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self._drop_last = drop_last
        self._non_blocking = non_blocking
        self.gradient_state = GradientState()
        self.iteration = 0
        self.end_of_dataloader = False
        self.remainder = -1
        self._progress = _Progress()
        self._in_epoch = False
        self._index_skip = 0
        self._resume_position = 0
        self._keep_global_rng = False
        self._loaded_state = False  # load_state_dict gave it an epoch and position
        self._epoch_start_states: list[torch.Tensor] | None = None
        self._generators: list[torch.Generator] | None = None
        self._snapshot: dict[str, Any] | None = None
        self._previous_snapshot: dict[str, Any] | None = None
        # skip_first_batches links the skipping loader and the loader it was made from (see _link_skip)
        self._epoch_source: Any = None
        self._position_offset = 0
        self._skipping_loader: Any = None

    def _link_skip(self, source: Any, num_batches: int) -> None:
        """Make this loader (from ``skip_first_batches(source, num_batches)``) stand in for ``source``.

        ``source`` forgets a position restored by ``load_state_dict`` (the caller now skips explicitly, and
        must not skip twice) and reports this loader's position while it runs. When it was given back an
        epoch (``load_state_dict``) or resumes exactly (``use_stateful_dataloader``,
        ``replay_epoch_on_resume``), it continues at the next epoch once this loader has finished its own.
        """
        import weakref

        source._resume_position = 0
        self._keep_global_rng, source._keep_global_rng = source._keep_global_rng, False
        source._in_epoch = False
        source._skipping_loader = weakref.ref(self)
        if getattr(source, "_resume_first", None) is not None:  # dispatcher: the epoch's padding samples
            self._resume_first = source._resume_first
            source._resume_first = None
        self._epoch_source = source
        self._position_offset = num_batches

    def _active_skipping(self) -> Any:
        """The loader made by ``skip_first_batches`` from this one, while it reads this loader's epoch."""
        skipping = self._skipping_loader() if self._skipping_loader is not None else None
        if skipping is not None and skipping._in_epoch and skipping._epoch_source is self:
            return skipping
        return None

    # -- what the Accelerator reads ------------------------------------------------------------

    @property
    def _yielded(self) -> int:
        return self._progress.yielded

    @_yielded.setter
    def _yielded(self, value: int) -> None:
        self._progress.yielded = value

    @property
    def use_stateful_dataloader(self) -> bool:
        """True when the loader was prepared with ``use_stateful_dataloader=True``: ``load_state`` then
        restores its position in the epoch (through torchdata's state when installed, else accel's own)."""
        return bool(self._position_opt_in or self._stateful)

    @property
    def _index_sampler(self) -> Any:
        inner = self.batch_sampler if self._auto_collation else self.sampler  # type: ignore[attr-defined]
        return _SkippableIndexSampler(self, inner)

    def _sharding_sampler(self) -> Any:
        """The `BatchSamplerShard` of this loader, if its batches are sharded by one."""
        node = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler  # type: ignore[attr-defined]
        while isinstance(node, SkipBatchSampler):
            node = node.batch_sampler
        return node if isinstance(node, BatchSamplerShard) else None

    @property
    def total_batch_size(self) -> int:
        """Number of samples in one step over all processes."""
        dataset = self.dataset  # type: ignore[attr-defined]
        if isinstance(dataset, IterableDatasetShard):
            return dataset.batch_size if dataset.split_batches else dataset.batch_size * dataset.num_processes
        shard = self._sharding_sampler()
        if shard is not None and shard.batch_size is not None:
            return shard.batch_size if shard.split_batches else shard.batch_size * shard.num_processes
        node = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler  # type: ignore[attr-defined]
        size = getattr(node, "batch_size", None) or self.batch_size  # type: ignore[attr-defined]
        return int(size) if size is not None else 1

    @property
    def total_dataset_length(self) -> int:
        """Number of samples of the whole dataset (before sharding)."""
        dataset = self.dataset  # type: ignore[attr-defined]
        return int(dataset.total_length) if isinstance(dataset, IterableDatasetShard) else len(dataset)

    def _samples_in_last_batch(self) -> int:
        """``remainder``: real samples in the last global batch, the dataset length modulo the global
        batch size (0 when it divides evenly; -1 when the length is unknown or the last batch is dropped).

        ``gather_for_metrics`` keeps that many leading entries of the last gathered batch, which drops
        the duplicates added to even it out, also when a caller expanded each sample (one loss per sample).
        """
        if self._drop_last:
            return -1
        try:
            length = self.total_dataset_length
            total = self.total_batch_size
        except TypeError:
            return -1
        return length % total if total > 0 else -1

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of this loader and pass it to its batch sampler and every sampler inside it that
        has ``set_epoch``; when none has, to the dataset (when it has ``set_epoch``).

        Args:
            epoch: The epoch number; it seeds the shuffling of that epoch.
        """
        self.iteration = int(epoch)
        batch_sampler = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler  # type: ignore[attr-defined]
        if not set_epoch_on(batch_sampler, epoch) and hasattr(self.dataset, "set_epoch"):  # type: ignore[attr-defined]
            self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]

    @property
    def base_dataloader(self) -> Any:
        """The ``DataLoader`` underneath, as the documented system names it; accel's prepared loaders
        are ``DataLoader`` (or ``StatefulDataLoader``) subclasses themselves, so it is the loader."""
        return self

    def begin(self) -> None:
        """Start an epoch: reset the end flags and become ``GradientState``'s active loader."""
        from accel_state.state import GradientState

        self.end_of_dataloader = False
        self.remainder = self._samples_in_last_batch()
        self.gradient_state = GradientState()  # a fresh handle survives GradientState._reset_state()
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Leave ``GradientState`` at the end of an epoch."""
        self.gradient_state._remove_dataloader(self)

    # -- epochs --------------------------------------------------------------------------------

    def _generator_list(self) -> list[torch.Generator]:
        if self._generators is None:
            self._generators = find_generators(
                self.batch_sampler,  # type: ignore[attr-defined]
                self.sampler,  # type: ignore[attr-defined]
                self.dataset,  # type: ignore[attr-defined]
                getattr(self, "generator", None),
                self.synchronized_generator,  # type: ignore[attr-defined]
            )
            if self._draws_from_global_generator():
                # a one-process random sampler without a generator seeds each epoch from torch's global
                # generator (as in the documented system): its state is what replays that epoch's order
                self._generators.append(torch.default_generator)
        return self._generators

    def _draws_from_global_generator(self) -> bool:
        sampler = getattr(self.batch_sampler, "sampler", None)  # type: ignore[attr-defined]
        # prepared already: a sampler the loader was to own a generator for holds it (see generator_owner)
        return (
            isinstance(sampler, RandomSampler)
            and not isinstance(sampler, SeedableRandomSampler)  # seeds a generator of its own each epoch
            and generator_owner(has_generator=sampler.generator is not None, sharded=False, resumable=False)
            is GeneratorOwner.GLOBAL
        )

    def _seedable_sampler(self) -> SeedableRandomSampler | None:
        node, seen = (self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler), set()  # type: ignore[attr-defined]
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            if isinstance(node, SeedableRandomSampler):
                return node
            inner = getattr(node, "batch_sampler", None)
            node = inner if inner is not None else getattr(node, "sampler", None)
        return None

    def _start_epoch(self) -> int:
        """Synchronise and record the generators, set the epoch, register; return batches to discard."""
        if self.rng_types:
            from accel_state.random import synchronize_rng_states

            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self._epoch_start_states = [g.get_state() for g in self._generator_list()]
        self.set_epoch(self.iteration)
        position = self._resume_position
        self._resume_position = 0
        self._yielded = position
        self._in_epoch = True
        # A resumed epoch starts from the loaded torchdata state (rewound_state_dict may go back to it).
        self._snapshot = self._snapshot if position > 0 else None
        self._previous_snapshot = None
        self.begin()
        # After load_state_dict, torchdata fast-forwards its own iterator; otherwise we skip here.
        return self.skip_batches + (0 if self._stateful else position)

    def _index_level_skip(self, batches: int) -> int:
        """Skip ``batches`` at the index level for map-style data (nothing is loaded); return what is left."""
        if batches and not isinstance(self.dataset, IterableDataset):  # type: ignore[attr-defined]
            self._index_skip = batches
            return 0
        return batches

    def _finish_epoch(self) -> None:
        source = self._epoch_source
        if source is not None and (
            source._loaded_state or source.replay_epoch_on_resume or source.use_stateful_dataloader
        ):
            # a loader given back its epoch (load_state_dict) or that resumes exactly continues at the next
            # epoch; otherwise, as in the documented system, the loader skipped from keeps its epoch count
            source.iteration = self.iteration + 1
            self._epoch_source = None  # later epochs of this loader are its own
            self._position_offset = 0
        self.iteration += 1
        self._in_epoch = False
        self._yielded = 0
        self._snapshot = None  # the base iterator's own (finished) state is the right one now
        self.end()

    def _take_snapshot(self) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        self._previous_snapshot = self._snapshot  # torchdata's state one batch earlier (rewound_state_dict)
        self._snapshot = StatefulDataLoader.state_dict(self)  # type: ignore[arg-type]

    def _iterate(self, make_base: Any, device: Any) -> Iterator[Any]:
        """Yield the batches one step behind the base iterator, so the last one is known in advance."""
        resuming = self._resume_position > 0 or self._keep_global_rng
        self._keep_global_rng = False
        skip = self._index_level_skip(self._start_epoch())
        try:
            if resuming and not self._draws_from_global_generator():
                # The uninterrupted run drew its iterator seed from torch's global generator before the
                # checkpoint was taken; drawing again here would shift every later random number. (A
                # sampler seeded from that generator had it restored to the epoch's start: draw again.)
                global_rng = torch.get_rng_state()
                base = make_base()
                torch.set_rng_state(global_rng)
            else:
                base = make_base()
            non_blocking = self._non_blocking
            stateful = self._stateful
            progress = self._progress
            move = device is not None
            try:
                current = next(base)
            except StopIteration:
                self.end_of_dataloader = True
                self._finish_epoch()
                return
            if move and device.type == "cpu" and _all_on(current, device):
                move = False  # batches read on CPU stay there: no per-batch work
            if move:
                from accel_state.nested import send_to_device

                current = send_to_device(current, device, non_blocking=non_blocking)
            while True:
                if stateful:
                    self._take_snapshot()
                try:
                    following = next(base)
                except StopIteration:
                    break
                if skip:
                    skip -= 1
                else:
                    progress.yielded += 1
                    yield current
                if move:
                    following = send_to_device(following, device, non_blocking=non_blocking)
                current = following
            self.end_of_dataloader = True
            if not skip:
                progress.yielded += 1
                yield current
        except GeneratorExit:
            # The loop was left early: keep the position (state_dict resumes there), leave GradientState.
            self.end()
            raise
        except BaseException:
            self.end()
            raise
        self._finish_epoch()

    # -- resume --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: epoch, batches already yielded in it, generator states.

        Made of ints, lists and tensors only, so it can be saved without pickle. Loading it into a loader
        built the same way makes its next iteration yield exactly the batches that were still to come.
        """
        skipping = self._active_skipping()
        if skipping is not None:
            return skipping.state_dict()  # the loader from skip_first_batches is reading this epoch
        in_epoch = self._in_epoch
        states = self._epoch_start_states if in_epoch and self._epoch_start_states is not None else None
        if states is None:
            states = [g.get_state() for g in self._generator_list()]
        state: dict[str, Any] = {
            "epoch": self.iteration,
            "batches_yielded": self._yielded + self._position_offset if in_epoch else 0,
            "generator_states": [s.clone() for s in states],
        }
        sampler = self._seedable_sampler()
        if sampler is not None:
            state["sampler"] = {"initial_seed": sampler.initial_seed, "epoch": self.iteration}
        if self._stateful:
            state["stateful"] = self._stateful_state()
        return state

    def rewound_state_dict(self) -> dict[str, Any]:
        """`state_dict()` as it stood before the last batch was yielded.

        A checkpoint taken when a step starts (``save_on_preemption``) was made after that step's batch
        was read; resuming from this state reads that batch again. Covers torchdata's part too.
        """
        skipping = self._active_skipping()
        if skipping is not None:
            return skipping.rewound_state_dict()
        state = self.state_dict()
        yielded = state["batches_yielded"]
        if yielded <= 0:
            return state
        state["batches_yielded"] = yielded - 1
        if "stateful" in state:
            previous = self._previous_snapshot
            # Back at the epoch's first batch: an empty torchdata state starts the epoch afresh.
            state["stateful"] = previous if previous is not None else {}
        return state

    def _stateful_state(self) -> dict[str, Any]:
        if self._snapshot is not None:
            return self._snapshot
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader.state_dict(self)  # type: ignore[arg-type]

    def load_state_dict(self, state_dict: dict[str, Any], *, restore_position: bool = True) -> None:
        """Resume from `state_dict()`: the next iteration continues where that one stopped.

        Args:
            state_dict: what `state_dict()` returned.
            restore_position: False restores the epoch and the shuffle order only: the next iteration
                replays that epoch from its first batch (what ``Accelerator.load_state`` does for loaders
                without ``use_stateful_dataloader=True``).

        Raises:
            KeyError: the state was not made by a prepared loader (or lacks torchdata's part).
            ValueError: it was made by a loader with another number of generators.
        """
        missing = [key for key in _STATE_KEYS if key not in state_dict]
        if missing:
            raise KeyError(
                f"{type(self).__name__}.load_state_dict: the state has no {missing} (keys found: {sorted(state_dict)}); "
                "pass a dict made by a prepared loader's state_dict()."
            )
        generators = self._generator_list()
        states = list(state_dict["generator_states"])
        if len(states) != len(generators):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state holds {len(states)} generator state(s) but this "
                f"loader has {len(generators)} generator(s); load it into a loader prepared like the one that saved it."
            )
        if self._stateful and restore_position and "stateful" not in state_dict:
            raise KeyError(
                "this loader uses use_stateful_dataloader=True but the state has no 'stateful' entry (it was saved "
                "by a loader without it); prepare both the same way."
            )
        for generator, saved in zip(generators, states):
            generator.set_state(torch.as_tensor(saved, dtype=torch.uint8).detach().cpu().clone())
        self.iteration = int(state_dict["epoch"])
        self._loaded_state = True
        position = int(state_dict["batches_yielded"])
        # Replaying a started epoch: the base iterator must not draw from torch's global generator again
        # (the uninterrupted run drew before the checkpoint), or every later random number shifts.
        self._keep_global_rng = position > 0 and not restore_position
        if not restore_position:
            position = 0
        sampler = self._seedable_sampler()
        if sampler is not None and "sampler" in state_dict:
            sampler.initial_seed = int(state_dict["sampler"]["initial_seed"])
            sampler.set_epoch(self.iteration)
        self._in_epoch = position > 0
        self._yielded = position
        self._epoch_start_states = [g.get_state() for g in generators] if position > 0 else None
        if self._stateful and not restore_position:
            from torchdata.stateful_dataloader import StatefulDataLoader

            StatefulDataLoader.load_state_dict(self, {})  # type: ignore[arg-type]
            self._snapshot = None
        elif self._stateful:
            from torchdata.stateful_dataloader import StatefulDataLoader

            saved = state_dict["stateful"]
            # A finished iterator's state would make torchdata build (and prefetch from) an iterator it then
            # throws away, drawing from the sampler's generator: between epochs there is nothing to restore.
            finished = position == 0 and bool(saved.get("_iterator_finished", False))
            StatefulDataLoader.load_state_dict(self, {} if finished else saved)  # type: ignore[arg-type]
            self._snapshot = state_dict["stateful"]
        self._resume_position = position


def load_checkpoint_state(loader: Any, state_dict: dict[str, Any]) -> None:
    """Load a loader's saved state the way ``Accelerator.load_state`` does.

    - A prepared loader that opted in with ``use_stateful_dataloader=True`` continues at the saved batch.
    - One prepared with accel's ``replay_epoch_on_resume=True`` gets back its epoch and shuffle order and
      replays that epoch from its first batch without drawing from torch's generator again, so the
      script's own skip (``skip_first_batches(loader, n)`` or a ``continue`` over the first ``n`` steps)
      resumes exactly.
    - Any other prepared loader is left as it was prepared, as in the documented system: its next
      iteration is a new epoch whose order comes from the random states ``load_state`` restored, and
      the script skips the seen batches itself.

    Args:
        loader: a prepared loader (or any object with ``load_state_dict``, given the state as it is).
        state_dict: the state saved by ``save_state``.
    """
    if not isinstance(loader, DataLoaderStateMixin) or loader.use_stateful_dataloader:
        loader.load_state_dict(state_dict)
    elif loader.replay_epoch_on_resume:
        loader.load_state_dict(state_dict, restore_position=False)


class DataLoaderShard(DataLoaderStateMixin, DataLoader):
    """A ``DataLoader`` that places batches on ``device``, keeps RNGs in step and knows its last batch.

    Args:
        dataset: the dataset (already sharded by a `BatchSamplerShard` or
            `IterableDatasetShard` when several processes read).
        device: move every batch there (``None``: leave batches where they are).
        rng_types: generators to synchronise from process 0 at the start of each iteration
            (``"torch"``, ``"cuda"``, ``"xla"``, ``"generator"`` ...).
        synchronized_generator: the generator that ``"generator"`` refers to.
        skip_batches: batches to skip at the start of every iteration.
        use_stateful_dataloader: build on torchdata's ``StatefulDataLoader``.
        torch_device_mesh: the device mesh the loader was sharded for (kept for reference).
        iteration: the epoch to start at (passed to ``set_epoch`` at the next iteration).
        **kwargs: every other ``DataLoader`` argument.
    """

    def __init__(
        self,
        dataset: Any,
        device: Any = None,
        rng_types: Any = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.device = torch.device(device) if isinstance(device, (str, int)) else device
        self.torch_device_mesh = torch_device_mesh
        self._init_state(rng_types, synchronized_generator, skip_batches, _drop_last, _non_blocking)
        self.iteration = iteration

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._iterate(super().__iter__, self.device)

    def __len__(self) -> int:
        length = super().__len__()
        if isinstance(self.dataset, IterableDataset) and self.skip_batches:
            return max(0, length - self.skip_batches)
        return length


class SkipDataLoader(DataLoaderStateMixin, DataLoader):
    """A ``DataLoader`` that skips the first ``skip_batches`` batches of every iteration.

    Used for iterable datasets, whose batches cannot be skipped without reading them.

    Args:
        dataset: The dataset to load from.
        skip_batches: How many batches to skip at the start of each iteration.
        use_stateful_dataloader: Build on torchdata's `StatefulDataLoader` (resumable mid-epoch) instead of
            `DataLoader`.
        **kwargs: The other arguments of `DataLoader`.
    """

    def __init__(
        self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.device = None
        self._init_state(None, None, skip_batches, bool(kwargs.get("drop_last", False)), False)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._iterate(super().__iter__, None)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)

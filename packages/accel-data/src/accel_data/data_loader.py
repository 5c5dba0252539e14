"""Turn a PyTorch ``DataLoader`` into one that shards, places and resumes: ``prepare_data_loader``.

This is the module documented as ``accelerate.data_loader`` (``accel.data_loader``): it also re-exports
the loader, sampler and dataset classes it builds.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accel_data.adapter import DataLoaderAdapter
from accel_data.config import DataLoaderConfiguration, check_resume_options
from accel_data.dispatch import DataLoaderDispatcher
from accel_data.loaders import DataLoaderShard, DataLoaderStateMixin, SkipDataLoader
from accel_data.mesh import data_parallel_coordinates
from accel_data.samplers import (
    BatchSamplerShard,
    GeneratorOwner,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    generator_owner,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]

# Handled by the new batch sampler, never copied from the original loader.
_REPLACED = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


@functools.cache
def _dataloader_arguments() -> dict[str, Any]:
    """Every ``DataLoader`` constructor argument of this torch version with its default."""
    params = inspect.signature(DataLoader.__init__).parameters
    return {name: p.default for name, p in params.items() if name != "self" and p.kind is not p.VAR_KEYWORD}


def _copied_kwargs(dataloader: DataLoader) -> dict[str, Any]:
    kwargs = {
        name: getattr(dataloader, name, default)
        for name, default in _dataloader_arguments().items()
        if name not in _REPLACED
    }
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)  # DataLoader refuses it without workers
    if hasattr(dataloader, "snapshot_every_n_steps"):
        kwargs["snapshot_every_n_steps"] = dataloader.snapshot_every_n_steps
    return kwargs


def get_sampler(dataloader: DataLoader) -> Any:
    """The sampler of indices inside ``dataloader`` (through its batch sampler).

    Args:
        dataloader: The data loader to look into.
    """
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)


def _with_sampler(batch_sampler: Any, sampler: Any) -> Any:
    """A copy of ``batch_sampler`` drawing from ``sampler`` (the user's object is left untouched)."""
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    clone = copy.copy(batch_sampler)
    clone.sampler = sampler
    return clone


def _shared_seed(initial: bool = False) -> int:
    """A seed of process 0 shared with every process: a draw from torch's RNG, or its initial seed."""
    from accel_state.operations import broadcast_object_list, world_size

    seed = [int(torch.random.initial_seed() if initial else torch.empty((), dtype=torch.int64).random_().item())]
    if world_size("prepare_data_loader") > 1:
        broadcast_object_list(seed)
    return seed[0]


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    replay_epoch_on_resume: bool = False,
) -> DataLoader:
    """Wrap ``dataloader`` so that each process reads its share and batches land on ``device``.

    Args:
        dataloader: the loader to prepare (map-style or iterable dataset, any sampler or batch sampler).
        device: where batches go when ``put_on_device`` (default: this process's device).
        num_processes / process_index: the processes sharing the data and this one (default: the
            current distributed setup).
        split_batches: the loader's batch size is the global one, cut in one slice per process.
        put_on_device: move every batch to ``device``.
        rng_types: generators synchronised from process 0 at each new iteration
            (``"torch"``, ``"cuda"``, ``"xla"``, ``"generator"`` ...).
        dispatch_batches: process 0 reads and sends each process its slice (default: for iterable
            datasets when ``put_on_device``).
        even_batches: complete the last round with samples from the start so that all processes get as
            many batches (map-style datasets).
        slice_fn_for_dispatch: how to cut a dispatched batch (default: slice every tensor).
        use_seedable_sampler: replace a ``RandomSampler`` by a `SeedableRandomSampler`.
        data_seed: its seed.
        non_blocking: move batches with ``non_blocking=True``.
        use_stateful_dataloader: opt in to resuming at the saved batch after ``Accelerator.load_state``
            (default, as documented: ``load_state`` leaves the loader as prepared); built on torchdata's
            ``StatefulDataLoader`` when torchdata is installed, on accel's own position otherwise.
        torch_device_mesh: shard over the mesh's data-parallel dimensions only, so tensor- and
            context-parallel ranks get the same batches.
        replay_epoch_on_resume: accel's opt-in: ``load_state`` gives the loader back the interrupted
            epoch and its order, replayed from the first batch, for scripts that skip by hand (see
            `DataLoaderConfiguration`).
        num_processes: Number of processes sharing the data; `None` takes it from the distributed state.
        process_index: Index of this process; `None` takes it from the distributed state.

    Returns:
        a `DataLoaderShard` or `DataLoaderDispatcher` (both ``DataLoader`` subclasses).
    """
    from accel_state.enums import DistributedType
    from accel_state.state import PartialState

    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}; "
            "wrap your dataset in DataLoader(dataset, batch_size=...) first."
        )
    check_resume_options("prepare_data_loader", use_stateful_dataloader, replay_epoch_on_resume)
    is_iterable = isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = bool(put_on_device and is_iterable)
    if dispatch_batches and not put_on_device:
        raise ValueError(
            "Using `dispatch_batches=True` requires `put_on_device=True`: it sends each process its slice on its device "
            "(or use dispatch_batches=False)."
        )
    state = PartialState()
    if num_processes is None:
        num_processes = state.num_processes
    if process_index is None:
        process_index = state.process_index
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index} is not in range(num_processes={num_processes})")
    num_processes, process_index = data_parallel_coordinates(torch_device_mesh, num_processes, process_index)
    if device is None and put_on_device:
        device = state.device

    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    batch_sampler = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
    if split_batches and not is_iterable:
        size = (
            dataloader.batch_size if dataloader.batch_size is not None else getattr(batch_sampler, "batch_size", None)
        )
        if size is None:
            raise ValueError(
                "split_batches=True needs the batch size to split, but this DataLoader has batch_size=None and its "
                f"batch sampler ({type(batch_sampler).__name__}) has no `batch_size` attribute. Give it one, or use "
                "split_batches=False."
            )
        if size % num_processes != 0:
            raise ValueError(
                f"split_batches=True cuts each batch of {size} samples in {num_processes} equal slices, but {size} is "
                f"not a multiple of {num_processes} (the number of processes): the batch size needs to be a round "
                f"multiple of the number of processes. Use a batch size that is a multiple of "
                f"{num_processes}, or split_batches=False to give each process whole batches of {size}."
            )
    if split_batches and is_iterable and dataloader.batch_size is not None and dataloader.batch_size % num_processes:
        raise ValueError(
            f"split_batches=True cuts each batch of {dataloader.batch_size} samples in {num_processes} equal slices, "
            f"but {dataloader.batch_size} is not a multiple of {num_processes} (the number of processes): the batch size "
            "needs to be a round multiple of the number of processes. Use a batch "
            "size that is a multiple of the number of processes, or split_batches=False."
        )

    rng_types = list(rng_types) if rng_types is not None else None
    synchronized_generator = None
    owned_generator = False
    new_dataset: Any = dataloader.dataset
    new_batch_sampler: Any = None if is_iterable else batch_sampler

    shard = (num_processes != 1 or state.distributed_type == DistributedType.MEGATRON_LM) and not dispatch_batches
    # Who shuffles a random sampler without a generator: the rule is generator_owner's (a sharded or
    # resumable loader gives it one; otherwise torch's global generator, as in the documented system).
    sampler: Any = get_sampler(dataloader)
    if not is_iterable and isinstance(sampler, RandomSampler):
        if use_seedable_sampler and not isinstance(sampler, SeedableRandomSampler):
            seeded = SeedableRandomSampler(
                sampler.data_source,
                replacement=sampler.replacement,
                num_samples=sampler._num_samples,
                generator=sampler.generator,
                # without a data_seed, torch's initial seed (as set by set_seed) of process 0 for everyone
                data_seed=data_seed if data_seed is not None else _shared_seed(initial=True),
            )
            new_batch_sampler = _with_sampler(batch_sampler, seeded)
            sampler = seeded
        elif (
            not use_seedable_sampler
            and generator_owner(
                has_generator=sampler.generator is not None,
                sharded=shard,
                resumable=use_stateful_dataloader or replay_epoch_on_resume,
            )
            is GeneratorOwner.LOADER
        ):
            owned = copy.copy(sampler)
            owned.generator = torch.Generator().manual_seed(_shared_seed())
            new_batch_sampler = _with_sampler(batch_sampler, owned)
            sampler = owned
            # Only this sampler draws from the generator just made, once per epoch on every process, from
            # the same seed: it stays in step without a collective at each epoch.
            owned_generator = True
        if not isinstance(sampler, SeedableRandomSampler):
            synchronized_generator = sampler.generator

    if shard:
        if is_iterable:
            generator = getattr(dataloader.dataset, "generator", None)
            if isinstance(generator, torch.Generator):
                synchronized_generator = generator
            new_dataset = IterableDatasetShard(
                new_dataset,
                batch_size=dataloader.batch_size,  # type: ignore[arg-type]
                drop_last=dataloader.drop_last,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
            )
        else:
            if new_batch_sampler is None:
                raise ValueError(
                    f"Cannot shard this DataLoader over {num_processes} processes: it has batch_size=None and no "
                    "batch sampler, so it reads samples one by one and there are no batches to deal out. Give it a "
                    "batch_size (or a batch_sampler / a BatchSampler as its sampler)."
                )
            new_batch_sampler = BatchSamplerShard(
                new_batch_sampler,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )

    if rng_types is not None and (synchronized_generator is None or owned_generator):
        rng_types = [kind for kind in rng_types if str(getattr(kind, "value", kind)) != "generator"]

    kwargs = _copied_kwargs(dataloader)
    common = {
        "use_stateful_dataloader": use_stateful_dataloader,
        "_drop_last": dataloader.drop_last,
        "_non_blocking": non_blocking,
    }
    if is_iterable or new_batch_sampler is None:
        kwargs["drop_last"] = dataloader.drop_last
        kwargs["batch_size"] = (
            dataloader.batch_size // num_processes
            if split_batches and shard and dataloader.batch_size is not None
            else dataloader.batch_size
        )
    elif sampler_is_batch_sampler:
        kwargs["sampler"] = new_batch_sampler
        kwargs["batch_size"] = dataloader.batch_size
    else:
        kwargs["batch_sampler"] = new_batch_sampler

    prepared: DataLoaderShard | DataLoaderDispatcher
    if dispatch_batches:
        kwargs.pop("generator", None)
        prepared = DataLoaderDispatcher(
            new_dataset,
            split_batches=split_batches,
            slice_fn=slice_fn_for_dispatch,
            torch_device_mesh=torch_device_mesh,
            **common,
            **kwargs,
        )
    else:
        prepared = DataLoaderShard(
            new_dataset,
            device=device if put_on_device and state.distributed_type != DistributedType.XLA else None,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            torch_device_mesh=torch_device_mesh,
            **common,
            **kwargs,
        )
    prepared.replay_epoch_on_resume = replay_epoch_on_resume
    return prepared


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like ``dataloader`` whose iterations start after its first ``num_batches`` batches.

    Map-style data is skipped at the index level (the skipped samples are never loaded); an iterable
    dataset is read and the batches dropped. A prepared loader keeps its sharding, device placement,
    synchronised generators and epoch; a plain ``DataLoader`` gives a plain one.

    Args:
        dataloader: The data loader (prepared or not).
        num_batches: How many batches to skip.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches needs a DataLoader, got {type(dataloader).__name__}")
    if not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be an int >= 0, got {num_batches!r}")
    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    kwargs = _copied_kwargs(dataloader)
    stateful = bool(getattr(dataloader, "use_stateful_dataloader", False))

    if isinstance(dataloader, DataLoaderDispatcher):
        if is_iterable:
            kwargs["batch_size"], kwargs["drop_last"] = dataloader.batch_size, dataloader.drop_last
        elif sampler_is_batch_sampler:
            kwargs["sampler"], kwargs["batch_size"] = dataloader.sampler, dataloader.batch_size
        else:
            kwargs["batch_sampler"] = dataloader.batch_sampler
        kwargs.pop("generator", None)
        new: Any = DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            skip_batches=dataloader.skip_batches + num_batches,
            use_stateful_dataloader=stateful,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn if dataloader._custom_slice else None,
            torch_device_mesh=dataloader.torch_device_mesh,
            iteration=dataloader.iteration,
            **kwargs,
        )
    elif isinstance(dataloader, DataLoaderShard):
        skip = dataloader.skip_batches
        if is_iterable:
            kwargs["batch_size"], kwargs["drop_last"] = dataloader.batch_size, dataloader.drop_last
            skip += num_batches
        elif sampler_is_batch_sampler:
            kwargs["sampler"] = SkipBatchSampler(dataloader.sampler, num_batches)
            kwargs["batch_size"] = dataloader.batch_size
        else:
            kwargs["batch_sampler"] = SkipBatchSampler(dataloader.batch_sampler, num_batches)
        new = DataLoaderShard(
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            skip_batches=skip,
            use_stateful_dataloader=stateful,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            torch_device_mesh=dataloader.torch_device_mesh,
            iteration=dataloader.iteration,
            **kwargs,
        )
    elif is_iterable:
        kwargs["batch_size"], kwargs["drop_last"] = dataloader.batch_size, dataloader.drop_last
        return SkipDataLoader(dataset, skip_batches=num_batches, **kwargs)
    else:
        if sampler_is_batch_sampler:
            kwargs["sampler"] = SkipBatchSampler(dataloader.sampler, num_batches)
            kwargs["batch_size"] = dataloader.batch_size
        else:
            kwargs["batch_sampler"] = SkipBatchSampler(dataloader.batch_sampler, num_batches)
        return DataLoader(dataset, **kwargs)
    # The new loader keeps the epoch (``iteration``): the sampler must shuffle as in this epoch.
    new._link_skip(dataloader, num_batches)
    return new

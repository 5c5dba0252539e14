"""The one walk over the registered objects: what ``save_state`` writes and ``load_state`` reads, in order.

Models and optimizers go through the strategy (full files on the writer, or shards from every rank);
schedulers, data-loader positions, the scaler and custom objects through the writer; the random states
through every process. Every file goes through the strategy's `CheckpointIO`. Used by the Accelerator's
checkpointer and by the documented module functions of ``accel_train.checkpointing``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accel_state.constants import RNG_STATE_NAME, SCALER_NAME
from accel_train.checkpoint.checks import check_folder, check_model_shapes, warn_recorded_sizes
from accel_train.checkpoint.names import custom_file, dataloader_file, rng_file, scheduler_file

logger = logging.getLogger(__name__)


def to_device(obj: Any, device: Any) -> Any:
    from accel_state.nested import send_to_device

    return send_to_device(obj, device) if device is not None else obj


def torch_device(value: Any, default: torch.device) -> Any:
    if value in (None, "on_device"):
        return default
    return value


# -- the one walk over the registered objects (save_state, load_state and the module-level functions) --


@dataclass
class TrainingObjects:
    """The objects a checkpoint holds, each kind in registration order.

    ``scaler`` is anything with ``state_dict`` / ``load_state_dict`` (the precision, or a gradient
    scaler); nothing is written for it when its ``state_dict()`` is ``None``.
    """

    models: Sequence[Any] = ()
    optimizers: Sequence[Any] = ()
    schedulers: Sequence[Any] = ()
    dataloaders: Sequence[Any] = ()
    custom: Sequence[Any] = ()
    scaler: Any = None


def write_objects(
    folder: str,
    objects: TrainingObjects,
    strategy: Any,
    *,
    weights: Sequence[Any],
    is_writer: bool,
    process_index: int,
    safe_serialization: bool = True,
    loader_state: Callable[[Any], dict[str, Any]] | None = None,
    rng: tuple[dict[str, torch.Tensor], dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Write every object of ``objects`` into ``folder``; called on every rank. Returns the entries written.

    Models and optimizers are written by the strategy (its entries: full files on the writer, or
    shards from every rank); schedulers, loader positions, the scaler and custom objects by the writer;
    the random states by every rank. Every file goes through ``strategy.checkpoint_io``.

    Args:
        folder: the (partial) checkpoint folder, existing.
        objects: what to save.
        strategy: the strategy of the run (its checkpoint entries and ``checkpoint_io``).
        weights: ``(model, state_dict)`` pairs to write (state dict ``None`` when the strategy writes shards).
        is_writer: whether this process writes the shared files.
        process_index: this process's rank (names its random-state file).
        safe_serialization: safetensors (True) or ``torch.save`` (False) for model weights.
        loader_state: the state of a data loader to write (default: ``loader.state_dict()``).
        rng: the random states to write, as `accel_train.checkpoint.file_io.rng_states()` gave them when
            the save was called (an asynchronous save writes later); default: the current ones.
    """
    io_ = strategy.checkpoint_io
    written: dict[str, Any] = {"models": [], "optimizers": []}
    for index, (model, state_dict) in enumerate(weights):
        written["models"].append(
            strategy.save_model_checkpoint(model, state_dict, folder, index, safe_serialization, is_writer)
        )
    for index, optimizer in enumerate(objects.optimizers):
        written["optimizers"].append(strategy.save_optimizer_checkpoint(optimizer, folder, index, is_writer))
    if is_writer:
        written.update({"schedulers": [], "dataloaders": [], "custom": []})
        for index, scheduler in enumerate(objects.schedulers):
            io_.save_object(scheduler.state_dict(), os.path.join(folder, scheduler_file(index)))
            written["schedulers"].append(scheduler_file(index))
        for index, loader in enumerate(objects.dataloaders):
            if hasattr(loader, "state_dict"):
                state = loader_state(loader) if loader_state is not None else loader.state_dict()
                io_.save_object(state, os.path.join(folder, dataloader_file(index)))
                written["dataloaders"].append(dataloader_file(index))
        scaler_state = objects.scaler.state_dict() if objects.scaler is not None else None
        if scaler_state is not None:
            io_.save_object(scaler_state, os.path.join(folder, SCALER_NAME))
            written["scaler"] = SCALER_NAME
        for index, obj in enumerate(objects.custom):
            io_.save_object(obj.state_dict(), os.path.join(folder, custom_file(index)))
            written["custom"].append(custom_file(index))
    if rng is None:
        io_.save_rng(os.path.join(folder, rng_file(process_index)))
    else:
        io_.save_rng(os.path.join(folder, rng_file(process_index)), states=rng)
    return written


def read_objects(
    folder: str,
    objects: TrainingObjects,
    strategy: Any,
    *,
    model_entries: Sequence[str],
    device: Any,
    optimizer_location: Any,
    process_index: int,
    strict: bool = True,
    distributed: bool = False,
    manifest: Mapping[str, Any] | None = None,
) -> None:
    """Restore every object of ``objects`` from ``folder`` (never unpickling); called on every rank.

    Args:
        folder: the checkpoint folder.
        objects: what to restore (data loaders without ``load_state_dict`` are skipped).
        strategy: the strategy of the run (reads its own model and optimizer entries).
        model_entries: the folder entry of each model, in order.
        device: where model weights go.
        optimizer_location: ``map_location`` of optimizer states.
        process_index: this process's rank (its random-state file).
        strict: every model key must match.
        distributed: every process calls this on the same folder (the checks are shared out between them).
        manifest: the folder's manifest; a file it records with another size is named in a warning by
            the main process, before anything is loaded (`warn_recorded_sizes()`).
    """
    import torch.distributed as dist

    io_ = strategy.checkpoint_io
    grouped = distributed and dist.is_available() and dist.is_initialized()
    ranks = range(dist.get_world_size()) if grouped else [process_index]  # whose own files the run reads
    check_folder(folder, io_, distributed=distributed, ranks=ranks, entries=strategy.checkpoint_entries())
    if process_index == 0:  # one stat per file and one warning per file in the run, as the resume's differences
        warn_recorded_sizes(folder, manifest)
    check_model_shapes(folder, objects.models, model_entries, strategy)
    for model, entry in zip(objects.models, model_entries):
        strategy.load_model_checkpoint(model, folder, entry, device, strict=strict)
    for index, optimizer in enumerate(objects.optimizers):
        strategy.load_optimizer_checkpoint(optimizer, folder, index, map_location=optimizer_location)
    for index, scheduler in enumerate(objects.schedulers):
        scheduler.load_state_dict(io_.load_object(os.path.join(folder, scheduler_file(index))))
    loaders = [loader for loader in objects.dataloaders if hasattr(loader, "load_state_dict")]
    for index, loader in enumerate(loaders):
        path = os.path.join(folder, dataloader_file(index))
        if os.path.isfile(path):
            from accel_data.loaders import load_checkpoint_state  # position only with use_stateful_dataloader

            load_checkpoint_state(loader, io_.load_object(path))
    if objects.scaler is not None and objects.scaler.state_dict() is not None:
        objects.scaler.load_state_dict(io_.load_object(os.path.join(folder, SCALER_NAME)))
    for index, obj in enumerate(objects.custom):
        obj.load_state_dict(io_.load_object(os.path.join(folder, custom_file(index))))
    rng_path = os.path.join(folder, rng_file(process_index))
    if os.path.isfile(rng_path):
        io_.load_rng(rng_path)
    elif os.path.isfile(os.path.join(folder, f"{RNG_STATE_NAME}_{process_index}.pkl")):
        logger.warning(
            "%s holds random states as a pickle (written by another tool); accel does not unpickle "
            "checkpoints, so the random generators were not restored",
            folder,
        )
    else:
        why = "saved with another number of processes, or by the main process alone"
        logger.warning("no random states for process %d in %s (%s): generators unchanged", process_index, folder, why)


def files_strategy() -> Any:
    """The single-device strategy's checkpoint entries, for the module-level functions (no Accelerator)."""
    from accel_train.strategies.base import Strategy

    return Strategy(None, None)  # type: ignore[arg-type]  # entries only: no device, no precision needed

"""Staging for an asynchronous save: a copy of the training state, taken when ``save_state`` is called.

An asynchronous save writes while training goes on, so what it writes must not be the live tensors
(the next optimizer step changes them in place). `stage_objects()` takes every object's state dict once
and copies each tensor into CPU memory of its own; the result is a `TrainingObjects` of write-only
`Snapshot` objects that `accel_train.checkpoint.walk.write_objects` writes like the live ones, so the
asynchronous path writes the same files, through the same writers, as the synchronous one.

Tensors that share memory in the live state (tied weights, views of one buffer) share it in the copy
too, so a file that stores shared tensors once does so for a staged state as well. The CPU memory of one
save is handed to the next (``reuse``): copying into memory already in use is about three times faster
than into fresh memory (no page faults), and the copy is the time a save blocks training.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accel_train.checkpoint.walk import TrainingObjects

__all__ = ["Snapshot", "StagedState", "StorageKey", "cpu_copy", "stage_objects"]


@dataclass
class Snapshot:
    """A state dict taken earlier, standing in for its object in the checkpoint walk (write-only)."""

    state: Any
    #: Tells a strategy's writer that this stands for an object (its state taken at the call).
    staged = True

    def state_dict(self) -> Any:
        return self.state

    def load_state_dict(self, state_dict: Any) -> None:
        raise TypeError("a staged snapshot of save_state is written, never loaded into")


class _NoState:
    """A registered data loader without ``state_dict``: keeps the places of the others (their file names)."""


#: A staged storage, by the live storage it copies: device, address and size in bytes.
StorageKey = tuple[Any, int, int]


def _copy_tensor(
    tensor: torch.Tensor, storages: dict[StorageKey, Any], reuse: dict[StorageKey, Any] | None
) -> torch.Tensor:
    """``tensor`` copied into CPU memory; tensors of one live storage share one copied storage, which is
    the previous save's copy of the same storage when ``reuse`` holds one."""
    tensor = tensor.detach()
    if type(tensor) is not torch.Tensor:
        return _copy_subclass(tensor, storages, reuse)
    try:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr(), storage.nbytes())
        copied = storages.get(key)
        if copied is None:
            copied = reuse.pop(key, None) if reuse else None
            if copied is not None:
                copied.copy_(storage)
            else:
                copied = storage.clone() if tensor.device.type == "cpu" else storage.cpu()
            storages[key] = copied
        view = torch.empty(0, dtype=tensor.dtype)
        return view.set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())
    except (RuntimeError, NotImplementedError, TypeError):  # tensor subclasses, meta or sparse tensors
        return tensor.to("cpu", copy=True)


def _copy_subclass(
    tensor: torch.Tensor, storages: dict[StorageKey, Any], reuse: dict[StorageKey, Any] | None
) -> torch.Tensor:
    """A tensor subclass copied into CPU memory: a DTensor as the same DTensor over a copy of its local shard
    (in memory reused like any tensor's); any other subclass by its own ``to``."""
    local = getattr(tensor, "_local_tensor", None)
    if isinstance(local, torch.Tensor) and type(local) is torch.Tensor and hasattr(tensor, "device_mesh"):
        from torch.distributed.tensor import DTensor

        copied = _copy_tensor(local, storages, reuse)
        placements = tensor.placements  # type: ignore[attr-defined]
        mesh = tensor.device_mesh  # type: ignore[attr-defined]
        return DTensor.from_local(copied, mesh, placements, run_check=False, shape=tensor.shape, stride=tensor.stride())
    return tensor.to("cpu", copy=True)


def cpu_copy(
    value: Any, storages: dict[StorageKey, Any] | None = None, reuse: dict[StorageKey, Any] | None = None
) -> Any:
    """A copy of a (nested) state dict that no later change of the live objects reaches.

    Tensors are copied into CPU memory (those sharing memory keep sharing it); dicts, lists and tuples
    are rebuilt; other values are deep-copied where they can be (plain numbers and strings stay as they are).

    Args:
        value: the state dict (or any part of one).
        storages: the copies made so far in this staging, keyed by the live storage (shared by the calls
            of one save, so that sharing across objects is kept too).
        reuse: the previous save's copies, written over instead of allocating (only once that save has
            been written); each is taken out when used.
    """
    memo = {} if storages is None else storages
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, memo, reuse)
    if isinstance(value, dict):
        items = [(key, cpu_copy(item, memo, reuse)) for key, item in value.items()]
        try:
            return type(value)(items)
        except TypeError:  # a dict subclass that cannot be built from items
            return dict(items)
    if isinstance(value, list):
        return [cpu_copy(item, memo, reuse) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(cpu_copy(item, memo, reuse) for item in value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied (a lock, a function's closure): written as it is
        return value


@dataclass
class StagedState:
    """What one process of an asynchronous save writes later: the objects (snapshots), the model weights
    as ``(model, state_dict)`` pairs, the random states and the gradients gathered so far; ``storages`` is
    the CPU memory they use (for the next save's ``reuse``, once this one is written)."""

    objects: TrainingObjects
    weights: list[tuple[Any, Any]]
    rng: tuple[dict[str, torch.Tensor], dict[str, str]]
    grads: dict[str, torch.Tensor] | None
    storages: dict[StorageKey, Any]


def stage_objects(
    objects: TrainingObjects,
    *,
    weights: Sequence[tuple[Any, Any]],
    is_writer: bool,
    optimizer_state: Callable[[Any], Any],
    loader_state: Callable[[Any], dict[str, Any]] | None = None,
    grads: dict[str, torch.Tensor] | None = None,
    reuse: dict[StorageKey, Any] | None = None,
    sharded: bool = False,
) -> StagedState:
    """Copy what this process writes: on the writer every object's state; on the others their own files.

    Args:
        objects: the live objects of the checkpoint.
        weights: ``(model, state_dict)`` pairs as the synchronous save would write them.
        is_writer: whether this process writes the shared files (the others write only their random
            states and gradients, so only those are copied there).
        optimizer_state: the strategy's full state dict of an optimizer.
        loader_state: the state of a data loader to write (default: ``loader.state_dict()``).
        grads: the gradients gathered so far between two optimizer steps, or ``None``.
        reuse: the ``storages`` of the previous save of this process, already written (see `cpu_copy()`).
        sharded: every process writes its own shards of the models and optimizers (copied everywhere).
    """
    from accel_train.checkpoint.file_io import rng_states

    rng = rng_states()
    rng = ({name: tensor.clone() for name, tensor in rng[0].items()}, dict(rng[1]))
    storages: dict[StorageKey, Any] = {}

    def copy(value: Any) -> Any:
        return cpu_copy(value, storages, reuse)

    staged_grads = copy(grads) if grads else None
    own = is_writer or sharded  # this process writes models and optimizers
    staged_weights = [(model, None if state is None else copy(state)) for model, state in weights] if own else []
    optimizers = [Snapshot(copy(optimizer_state(optimizer)) if own else {}) for optimizer in objects.optimizers]
    if not is_writer:
        return StagedState(TrainingObjects(optimizers=optimizers), staged_weights, rng, staged_grads, storages)
    loaders: list[Any] = []
    for loader in objects.dataloaders:
        if not hasattr(loader, "state_dict"):
            loaders.append(_NoState())
            continue
        loaders.append(Snapshot(copy(loader_state(loader) if loader_state is not None else loader.state_dict())))
    scaler_state = objects.scaler.state_dict() if objects.scaler is not None else None
    staged = TrainingObjects(
        models=list(objects.models),
        optimizers=optimizers,
        schedulers=[Snapshot(copy(scheduler.state_dict())) for scheduler in objects.schedulers],
        dataloaders=loaders,
        custom=[Snapshot(copy(obj.state_dict())) for obj in objects.custom],
        scaler=None if scaler_state is None else Snapshot(copy(scaler_state)),
    )
    return StagedState(staged, staged_weights, rng, staged_grads, storages)

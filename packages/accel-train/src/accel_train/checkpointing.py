"""``save_state`` / ``load_state``: the documented checkpoint layout, written atomically, read safely.

This is the documented module (``accelerate.checkpointing``): the functions that checkpoint without an
Accelerator (`save_accelerator_state`, `load_accelerator_state`, `save_custom_state`,
`load_custom_state`). The work is done by the checkpoint package, `accel_train.checkpoint`:

* ``names``: the documented file and folder names, and the patterns that recognise them;
* ``folder``: a save writes a hidden ``.<name>.<token>.partial`` folder (one save at a time:
  ``folder_lock``) and swaps it into place whole once every process has finished its files, so a process
  killed during ``save_state`` leaves the previous checkpoint; ``total_limit`` prunes only after that;
* ``checks``: before anything is loaded, what the folder holds against what was prepared, and every file a
  load reads (never unpickling code: ``file_io`` and ``safety`` for the formats and allow-lists);
* ``walk``: the one walk over the registered objects that saving and loading share.

The names of those modules that strategies and the Accelerator's checkpointer use are re-exported here.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from accel_train.checkpoint.checks import check_contents, check_folder, check_model_shapes, warn_recorded_sizes
from accel_train.checkpoint.folder import (
    begin,
    discard,
    new_save_token,
    partial_dir,
    prune,
    publish,
    resolve_input_dir,
    swap_into_place,
)
from accel_train.checkpoint.names import (
    CHECKPOINTS_FOLDER,
    FILE_NAMES,
    FSDP_FULL_MODEL_PATTERN,
    MANIFEST_NAME,
    MODEL_FILE_PATTERN,
    OPTIMIZER_FILE_PATTERN,
    SHARDED_MODEL_PATTERN,
    SHARDED_OPTIMIZER_PATTERN,
    CheckpointMismatchError,
    custom_file,
    dataloader_file,
    grads_file,
    indexed,
    model_file,
    optimizer_file,
    rng_file,
    scheduler_file,
    sharded_model_dir,
    sharded_optimizer_dir,
)
from accel_train.checkpoint.walk import (
    TrainingObjects,
    files_strategy,
    read_objects,
    to_device,
    torch_device,
    write_objects,
)

__all__ = [
    "CHECKPOINTS_FOLDER",
    "FILE_NAMES",
    "FSDP_FULL_MODEL_PATTERN",
    "MANIFEST_NAME",
    "MODEL_FILE_PATTERN",
    "OPTIMIZER_FILE_PATTERN",
    "SHARDED_MODEL_PATTERN",
    "SHARDED_OPTIMIZER_PATTERN",
    "CheckpointMismatchError",
    "TrainingObjects",
    "begin",
    "check_contents",
    "check_folder",
    "check_model_shapes",
    "warn_recorded_sizes",
    "custom_file",
    "dataloader_file",
    "discard",
    "grads_file",
    "indexed",
    "load_accelerator_state",
    "load_custom_state",
    "model_file",
    "new_save_token",
    "optimizer_file",
    "partial_dir",
    "prune",
    "publish",
    "read_objects",
    "resolve_input_dir",
    "rng_file",
    "save_accelerator_state",
    "save_custom_state",
    "scheduler_file",
    "sharded_model_dir",
    "sharded_optimizer_dir",
    "swap_into_place",
    "to_device",
    "torch_device",
    "write_objects",
]


# -- the documented module-level functions (for code that checkpoints without an Accelerator) ----------


def _model_entry(folder: str, index: int) -> str:
    for safe in (True, False):
        if os.path.isfile(os.path.join(folder, model_file(index, safe))):
            return model_file(index, safe)
    raise FileNotFoundError(f"{folder} holds no {model_file(index, True)} or {model_file(index, False)}")


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    model_states: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int | None = None,
    scaler: Any = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> str:
    """Write models, optimizers, schedulers, loader positions, scaler and this process's random states
    into ``output_dir`` in the layout ``Accelerator.save_state`` uses (process 0 writes the shared files,
    or each machine's first process with ``save_on_each_node``); returns ``output_dir``.

    ``step`` is accepted for compatibility; accel keeps no step counter in the random-state file.
    """
    folder = os.fspath(output_dir)
    os.makedirs(folder, exist_ok=True)
    local_main = int(os.environ.get("LOCAL_RANK", process_index)) == 0
    objects = TrainingObjects(optimizers=optimizers, schedulers=schedulers, dataloaders=dataloaders, scaler=scaler)
    write_objects(
        folder,
        objects,
        files_strategy(),
        weights=[(None, state) for state in model_states],
        is_writer=process_index == 0 or (save_on_each_node and local_main),
        process_index=process_index,
        safe_serialization=safe_serialization,
    )
    return folder


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: Any = None,
    map_location: Any = None,
    load_kwargs: dict[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Restore what `save_accelerator_state()` wrote into the given objects (never unpickling);
    returns the attributes to override on the caller (none are kept by accel: an empty dict)."""
    folder = os.fspath(input_dir)
    device = map_location if map_location not in (None, "on_device") else "cpu"
    read_objects(
        folder,
        TrainingObjects(models, optimizers, schedulers, dataloaders, scaler=scaler),
        files_strategy(),
        model_entries=[_model_entry(folder, index) for index in range(len(models))],
        device=device,
        optimizer_location=(load_kwargs or {}).get("map_location", device),
        process_index=process_index,
        strict=load_model_func_kwargs.pop("strict", True),
    )
    return {}


def save_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False) -> None:
    """Write ``obj.state_dict()`` to ``<path>/custom_checkpoint_<index>.pkl`` (the save_state layout).

    ``save_on_each_node`` is accepted for compatibility: the caller decides which process calls it.
    """
    from accel_train.checkpoint.file_io import CheckpointIO

    os.makedirs(os.fspath(path), exist_ok=True)
    CheckpointIO().save_object(obj.state_dict(), os.path.join(os.fspath(path), custom_file(index)))


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Restore ``obj`` from ``<path>/custom_checkpoint_<index>.pkl`` (never unpickling objects)."""
    from accel_train.checkpoint.file_io import CheckpointIO

    obj.load_state_dict(CheckpointIO().load_object(os.path.join(os.fspath(path), custom_file(index))))

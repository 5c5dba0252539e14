"""megatron-core's distributed checkpoints, written and read only here, every file checked before reading.

The Megatron-LM backend keeps each model and optimizer of a ``save_state`` folder as a megatron-core
``dist_checkpointing`` folder (``pytorch_model_{i}/``, ``optimizer_{i}/``). accel writes them with the
``torch_dist`` backend, which lays out:

=====================  =================================================================================
``metadata.json``      which backends wrote the folder (``sharded_backend``, ``common_backend``)
``.metadata``          torch.distributed.checkpoint's index: a pickle, read by megatron-core with
                       ``pickle.load``
``__<r>_<i>.distcp``   the tensor shards and their small pickled items
``common.pt``          the values every process shares (``torch.save``, read with ``torch.load``)
``<key>/shard_*.pt``   sharded objects (``torch.save`` each)
=====================  =================================================================================

Before megatron-core reads a folder, `check_folder()` checks all of it as accel checks its own DCP
folders: ``.metadata`` with the allow-list unpickler, each ``.distcp`` item and every ``.pt`` file with
``weights_only`` onto the ``meta`` device. A folder of another backend (``zarr`` ...), whose files accel
cannot check, is refused by name. Loading is a collective: the processes share the checks out between
them and all raise the same error, before any of them has changed a tensor.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError

__all__ = ["CHECKABLE_BACKENDS", "check_folder", "folder_checks", "load", "save"]

#: The ``metadata.json`` backends whose files accel can check: (``sharded_backend``, ``common_backend``).
CHECKABLE_BACKENDS: tuple[str, str] = ("torch_dist", "torch")

_CONFIG = "metadata.json"


def save(sharded_state_dict: dict[str, Any], folder: str) -> None:
    """Write ``sharded_state_dict`` (megatron-core's sharded tensors and objects) as the folder ``folder``
    (a collective: every process of the model's groups writes its shards).

    Args:
        sharded_state_dict: what ``model.sharded_state_dict()`` (or the optimizer's) returns.
        folder: the folder to write, inside a ``save_state`` partial folder.
    """
    from megatron.core import dist_checkpointing

    from accel_train.checkpoint.file_io import writing

    os.makedirs(folder, exist_ok=True)
    with writing(folder):
        dist_checkpointing.save(sharded_state_dict, folder)


def load(sharded_state_dict: dict[str, Any], folder: str, distributed: bool = True) -> dict[str, Any]:
    """Read the folder ``folder`` into the shapes of ``sharded_state_dict``, after `check_folder()`.

    Args:
        sharded_state_dict: what ``model.sharded_state_dict()`` (or the optimizer's, ``is_loading=True``)
            returns: which shards this process reads.
        folder: a folder `save()` wrote.
        distributed: share the checks out between the processes (a collective; every process calls it).

    Returns:
        The state dict megatron-core read (plain tensors in place of the sharded ones).

    Raises:
        UnsafeCheckpointError: a file would run code, or the folder is of a backend accel cannot check.
        CorruptCheckpointError: a file is damaged, or ``metadata.json`` is not megatron-core's.
    """
    from megatron.core import dist_checkpointing

    check_folder(folder, distributed=distributed)
    return dist_checkpointing.load(sharded_state_dict, folder)


def check_folder(folder: str, distributed: bool = False) -> None:
    """Check every file megatron-core would read in ``folder``; raise the first refusal (nothing is loaded).

    Args:
        folder: a megatron-core ``dist_checkpointing`` folder.
        distributed: share the checks out between the processes (a collective).

    Raises:
        UnsafeCheckpointError: a pickle names a global outside the allow-list, or the folder was written by
            a backend other than ``torch_dist`` / ``torch``.
        CorruptCheckpointError: a file is damaged or ``metadata.json`` is not a JSON object.
        FileNotFoundError: ``metadata.json`` or a data file ``.metadata`` names is missing.
    """
    from accel_train.checkpoint.safety import run_checks

    run_checks(lambda: folder_checks(folder), distributed=distributed)


def folder_checks(folder: str) -> list[tuple[str, Any]]:
    """The checks of ``folder`` (see `check_folder()`): its ``metadata.json`` and ``.metadata`` are read
    now; one check per DCP item and per ``.pt`` file is returned, to be shared out."""
    from accel_train.checkpoint.safety import check_torch_file, dcp_folder_checks

    _check_backends(folder)
    checks: list[tuple[str, Any]] = list(dcp_folder_checks(folder))
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".pt"):
                path = os.path.join(root, name)
                checks.append((os.path.relpath(path, folder), functools.partial(check_torch_file, path)))
    return checks


def _check_backends(folder: str) -> None:
    """``metadata.json`` names the backends accel can check, or the folder is refused by name."""
    path = os.path.join(folder, _CONFIG)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{folder} has no {_CONFIG}: it is not a megatron-core dist_checkpointing folder (or it is incomplete)"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptCheckpointError(
            path, "megatron-core's backend record in JSON", f"bytes that are not JSON ({error})"
        ) from None
    if not isinstance(config, dict):
        raise CorruptCheckpointError(path, "a JSON object naming the backends", f"a JSON {type(config).__name__}")
    found = (config.get("sharded_backend"), config.get("common_backend", "torch"))
    if found != CHECKABLE_BACKENDS:
        raise UnsafeCheckpointError(
            path,
            f"a folder written by the backends sharded={found[0]!r}, common={found[1]!r}, whose files accel "
            "cannot check before megatron-core reads them",
            f"accel loads Megatron checkpoints of sharded_backend={CHECKABLE_BACKENDS[0]!r}, "
            f"common_backend={CHECKABLE_BACKENDS[1]!r} (what accel's save_state writes)",
        )

"""Merge a sharded FSDP checkpoint (``torch.distributed.checkpoint`` folder) or a DeepSpeed ZeRO checkpoint
into one weights file."""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["merge_fsdp_weights"]


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    max_shard_size: int | str | None = None,
) -> str:
    """Read the shards of ``checkpoint_dir`` (written with ``SHARDED_STATE_DICT``, on any number of
    processes) on this one process and write ``model.safetensors`` (or ``pytorch_model.bin``) into
    ``output_path``; returns the file path.

    ``checkpoint_dir`` is a DCP folder (``pytorch_model_fsdp_0``), a DeepSpeed engine's folder
    (``pytorch_model``, ZeRO 0-3: its fp32 partitions are joined) or a ``save_state`` folder holding one. With ``max_shard_size`` the weights are split into files of at most that size with an index
    (``model.safetensors.index.json``) and the index path is returned. Only the main process writes
    when called inside a distributed run.

    Args:
        checkpoint_dir: Folder of the sharded checkpoint (a DCP folder, a DeepSpeed engine's folder, or a
            ``save_state`` folder holding one).
        output_path: Folder the merged weights are written to.
        safe_serialization: Whether to write safetensors rather than a pickled ``pytorch_model.bin``.
            Defaults to `True`.
        remove_checkpoint_dir: Whether ``checkpoint_dir`` is deleted once merged. Defaults to `False`.
        max_shard_size: Largest size of one output file (bytes, or a string such as `"5GB"`); `None` writes one
            file. Defaults to `None`.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` does not exist.
        UnsafeCheckpointError: a file would run code, or a DeepSpeed folder holds a DCP ``.metadata`` (named).
        CorruptCheckpointError: the ``.metadata`` declares a tensor its data files cannot hold (named).
        ValueError: with ``remove_checkpoint_dir``, ``output_path`` lies in the folder it deletes; or the
            folder holds no tensor.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    output_path = os.fspath(output_path)
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint folder {checkpoint_dir} does not exist")
    deepspeed_dir = None
    if os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        from accel_train.checkpoint.layout import is_engine_folder, stray_metadata_error

        if is_engine_folder(checkpoint_dir):  # a DeepSpeed folder: its .metadata was planted, never written
            raise stray_metadata_error(os.path.join(checkpoint_dir, ".metadata"))
    else:
        from accel_train.checkpoint.deepspeed_merge import deepspeed_engine_dir
        from accel_train.checkpointing import sharded_model_dir

        model_dir = os.path.join(checkpoint_dir, sharded_model_dir(0))
        deepspeed_dir = deepspeed_engine_dir(checkpoint_dir)
        if os.path.isfile(os.path.join(model_dir, ".metadata")):
            checkpoint_dir = model_dir
        elif deepspeed_dir is not None:
            checkpoint_dir = deepspeed_dir
        else:
            raise ValueError(
                f"{checkpoint_dir} is not a torch.distributed.checkpoint folder (no .metadata file) nor a DeepSpeed "
                "checkpoint (no *_model_states.pt file); give the folder of a sharded FSDP checkpoint (for example "
                "pytorch_model_fsdp_0), a DeepSpeed engine's folder (pytorch_model) or the save_state folder holding one"
            )
    if os.path.isfile(output_path):
        raise ValueError(f"output_path {output_path} is a file; give a folder to write the merged weights into")
    if remove_checkpoint_dir:
        _check_output_survives(checkpoint_dir, output_path)
    _check_no_link_out(checkpoint_dir)
    writer = _is_main_process()
    from accel_train.checkpointing import model_file

    name = model_file(0, safe_serialization)
    target = os.path.join(output_path, name)
    if writer:
        from accel_train.checkpoint.file_io import CheckpointIO

        if deepspeed_dir is not None:
            from accel_train.checkpoint.deepspeed_merge import read_deepspeed_weights

            state_dict = read_deepspeed_weights(deepspeed_dir)
        else:
            state_dict = CheckpointIO().load_sharded_whole(checkpoint_dir)
        if set(state_dict) == {"model"} and isinstance(state_dict["model"], dict):
            state_dict = state_dict["model"]
        if not any(isinstance(value, torch.Tensor) for value in state_dict.values()):
            raise ValueError(
                f"{checkpoint_dir} holds no tensor to merge (its metadata names none): an empty or planted "
                "checkpoint; nothing was written"
            )
        target = _write_atomically(state_dict, output_path, name, safe_serialization, max_shard_size)
        logger.info("merged %d tensors from %s into %s", len(state_dict), checkpoint_dir, target)
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    _barrier()
    return target


def _check_no_link_out(folder: str) -> None:
    """Refuse a symbolic link anywhere under the folder to merge that resolves outside it (named, with its
    target), before anything is read: the backends' readers would follow it."""
    from accel_bigmodel.confine import allowed_root, check_confined

    root = allowed_root(folder)
    for current, dirs, files in os.walk(folder):
        for name in sorted(dirs) + sorted(files):
            check_confined(os.path.join(current, name), folder, root=root)


def _check_output_survives(removed: str, output_path: str) -> None:
    """Refuse, before anything is read or written, an ``output_path`` that lies in the folder
    ``remove_checkpoint_dir`` deletes: the merged weights would be reported written and then deleted with it.

    Raises:
        ValueError: ``output_path`` is ``removed`` or a folder inside it (both named).
    """
    folder = os.path.realpath(removed)
    target = os.path.realpath(output_path)
    if target == folder or target.startswith(folder.rstrip(os.sep) + os.sep):
        raise ValueError(
            f"output_path {output_path} lies inside the checkpoint folder {removed}, which remove_checkpoint_dir "
            "deletes once merged (the merged weights with it); write them outside that folder, or keep the "
            "checkpoint folder"
        )


_MERGE_OUTPUT_RE = re.compile(
    r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$|^(model|pytorch_model)\.(safetensors|bin)\.index\.json$"
)


def _write_atomically(
    state_dict: dict[str, Any], output_path: str, name: str, safe_serialization: bool, max_shard_size: Any
) -> str:
    """Write the merged weights into a hidden sibling folder, then swap it into ``output_path`` in one step:
    a kill at any moment leaves the previous output (all its shards and index) or the new one, never a mix.
    Weights files of a previous merge go with the previous folder, after the new one is in place; other
    files of ``output_path`` (a ``config.json``) move into the new folder. Returns the written file (or index).
    """
    from accel_train import checkpointing
    from accel_train.checkpoint.file_io import writing

    output_path = os.path.abspath(output_path)
    parent = os.path.dirname(output_path)
    os.makedirs(parent, exist_ok=True)
    tmp = checkpointing.partial_dir(output_path)
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    target = os.path.join(tmp, name)
    with writing(target):
        os.makedirs(tmp)
        if max_shard_size is not None:
            from accel_bigmodel.sharding import save_sharded

            save_sharded(state_dict, tmp, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
            index = target + ".index.json"
            target = index if os.path.isfile(index) else target
        else:
            from accel_train.checkpoint import file_io as io

            io.save_weights(state_dict, target, safe_serialization=safe_serialization)
        _fsync_folder(tmp)
        checkpointing.swap_into_place(tmp, output_path, lambda entry: bool(_MERGE_OUTPUT_RE.match(entry)))
    return os.path.join(output_path, os.path.basename(target))


def _fsync_folder(folder: str) -> None:
    """Flush the files of ``folder`` to disk before it replaces the previous output (a power cut after the
    swap must not find empty files)."""
    for entry in os.listdir(folder):
        path = os.path.join(folder, entry)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def _is_main_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()

"""Merge a sharded FSDP checkpoint (``torch.distributed.checkpoint`` folder) into one weights file."""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["merge_fsdp_weights"]


def _load_distributed_checkpoint(checkpoint_dir: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state_dict: dict[str, Any] = {}
    _load_state_dict(
        state_dict,
        storage_reader=dcp.FileSystemReader(checkpoint_dir),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    return state_dict


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> str:
    """Read the shards of ``checkpoint_dir`` (written with ``SHARDED_STATE_DICT``) on one process and
    write ``model.safetensors`` (or ``pytorch_model.bin``) into ``output_path``; returns the file path.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint folder {checkpoint_dir} does not exist")
    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        model_dir = os.path.join(checkpoint_dir, "pytorch_model_fsdp_0")
        if os.path.isfile(os.path.join(model_dir, ".metadata")):
            checkpoint_dir = model_dir
        else:
            raise ValueError(
                f"{checkpoint_dir} is not a torch.distributed.checkpoint folder (no .metadata file); give the "
                "folder of a sharded FSDP checkpoint (for example pytorch_model_fsdp_0)"
            )
    state_dict = _load_distributed_checkpoint(checkpoint_dir)
    if set(state_dict) == {"model"} and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    os.makedirs(output_path, exist_ok=True)
    from accel_train import checkpoint_io as io

    name = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    target = os.path.join(output_path, name)
    tmp = target + ".partial"
    io.save_weights(state_dict, tmp, safe_serialization=safe_serialization)
    os.replace(tmp, target)
    logger.info("merged %d tensors from %s into %s", len(state_dict), checkpoint_dir, target)
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
    return target

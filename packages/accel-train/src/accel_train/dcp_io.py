"""Sharded checkpoints of models whose parameters are DTensors (FSDP2, tensor parallel, their 2-D mix),
through ``torch.distributed.checkpoint`` (DCP): every rank writes its own shards into one folder.

Full state dicts (``full_model_state_dict``) are gathered to rank 0 and moved to CPU; the other ranks
get an empty dict. Loading a sharded folder reshards when the world size changed (DCP plans the reads
from the saved metadata). Every function is called on every rank.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "full_model_state_dict",
    "load_sharded_model",
    "load_sharded_optimizer",
    "save_sharded_model",
    "save_sharded_optimizer",
]


def _options(full: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full)


def full_model_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The whole model's state dict on rank 0 (CPU tensors), ``{}`` on the other ranks."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(True))


def save_sharded_model(model: torch.nn.Module, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save(get_model_state_dict(model, options=_options(False)), checkpoint_id=path)


def load_sharded_model(model: torch.nn.Module, path: str, strict: bool = True) -> None:
    """Load a folder written by :func:`save_sharded_model`; a tensor whose shape differs is named."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(model, options=_options(False))
    _check_shapes(state, path)
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state, options=_options(False))


def _check_shapes(state: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    wrong = []
    for key, value in state.items():
        saved = metadata.get(key)
        size = getattr(saved, "size", None)
        if isinstance(value, torch.Tensor) and size is not None and tuple(size) != tuple(value.shape):
            wrong.append(f"{key}: saved {tuple(size)}, model {tuple(value.shape)}")
    missing = [key for key in state if key not in metadata]
    if wrong or missing:
        raise ValueError(
            f"the sharded checkpoint {path} does not fit this model: "
            + "; ".join(wrong + [f"{key}: not in the checkpoint" for key in missing[:10]])
        )


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save(get_optimizer_state_dict(model, optimizer, options=_options(False)), checkpoint_id=path)


def load_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_options(False))
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, optimizer, state, options=_options(False))

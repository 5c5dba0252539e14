"""Which folder of a checkpoint is read by which backend's loader, and the files that loader opens.

A folder's kind comes from the layout (its name in the checkpoint), never from what it happens to hold:
``pytorch_model_fsdp_{i}/`` and ``optimizer_{i}/`` are ``torch.distributed.checkpoint`` folders, whose
``.metadata`` names the files torch reads; ``pytorch_model/`` (``pytorch_model_{i}/``) is a DeepSpeed
engine's folder, whose every pickled file DeepSpeed's loaders may open with ``weights_only=False``. A
DCP metadata file in an engine folder is therefore refused by name: had it been taken for a sign of a DCP
folder, the engine's own files would have gone unchecked (issue 36).
"""

from __future__ import annotations

import os
import re

from accel_state.errors import UnsafeCheckpointError

__all__ = [
    "DCP_FOLDER_RE",
    "engine_torch_files",
    "is_engine_folder",
    "stray_metadata_error",
    "torch_files",
]

#: ``torch.distributed.checkpoint`` folders of the layout (sharded model and optimizer state).
DCP_FOLDER_RE = re.compile(r"^(?:pytorch_model_fsdp(?:_\d+)?|optimizer_\d+)$")
#: The files DeepSpeed's loaders (and its ``zero_to_fp32`` / ``ds_to_universal``) may unpickle.
TORCH_FILE_SUFFIXES = (".pt", ".bin", ".pkl", ".pth")

_MODEL_STATES_RE = re.compile(r"^(?:mp_rank_\d+|(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+)_model_states\.pt$")
_DCP_METADATA_RE = re.compile(r"^(?:__\d+)?\.metadata$")


def is_engine_folder(folder: str) -> bool:
    """Whether ``folder`` holds a DeepSpeed engine's model states (``*_model_states.pt``)."""
    return os.path.isdir(folder) and any(_MODEL_STATES_RE.match(name) for name in os.listdir(folder))


def stray_metadata_error(path: str) -> UnsafeCheckpointError:
    """The error for a DCP metadata file at ``path``, inside a DeepSpeed engine folder."""
    return UnsafeCheckpointError(
        path,
        "torch.distributed.checkpoint metadata inside a DeepSpeed engine folder, where the layout has none",
        "DeepSpeed writes no such file; remove it if the folder is otherwise trusted, or load an earlier checkpoint.",
    )


def _files(folder: str) -> list[str]:
    """Every file under ``folder`` at any depth, relative to it, in a stable order."""
    found: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.relpath(os.path.join(root, name), folder) for name in sorted(files)]
    return found


def torch_files(folder: str) -> list[str]:
    """Every ``.pt`` / ``.bin`` / ``.pkl`` / ``.pth`` file under ``folder`` at any depth, relative to it,
    sorted: the pickled files a backend may open beside a ``torch.distributed.checkpoint`` folder's own
    data files (Megatron-LM's ``common.pt``), each to be checked like any other."""
    return [relative for relative in _files(folder) if relative.endswith(TORCH_FILE_SUFFIXES)]


def engine_torch_files(folder: str) -> list[str]:
    """The files of the DeepSpeed engine folder ``folder`` that DeepSpeed's loaders may unpickle: every
    ``.pt`` / ``.bin`` / ``.pkl`` / ``.pth`` file at any depth, as paths relative to ``folder``, sorted.

    Args:
        folder: the engine's folder (``pytorch_model/`` of a ``save_state`` folder, or a tag folder).

    Raises:
        UnsafeCheckpointError: the folder holds a DCP ``.metadata`` (named), which DeepSpeed never writes.
    """
    relatives = _files(folder)
    for relative in relatives:
        if _DCP_METADATA_RE.match(os.path.basename(relative)):
            raise stray_metadata_error(os.path.join(folder, relative))
    return [relative for relative in relatives if relative.endswith(TORCH_FILE_SUFFIXES)]

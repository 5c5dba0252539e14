"""How accel reads a DeepSpeed engine's checkpoint without letting it run code.

DeepSpeed's ``engine.load_checkpoint`` reads its files (``mp_rank_00_model_states.pt``,
``zero_pp_rank_{r}_mp_rank_00_optim_states.pt``, ...) with ``torch.load(weights_only=False)``. Before it
runs, accel checks every ``.pt`` file of the tag folder with ``torch.load(weights_only=True)`` onto the
``meta`` device (no tensor bytes are read), allowing only the few DeepSpeed types these files hold
(:data:`DEEPSPEED_CHECKPOINT_GLOBALS`); any other Python global is refused with
:class:`~accel_state.errors.UnsafeCheckpointError` and nothing is loaded. The layout stays
DeepSpeed's own (``zero_to_fp32.py`` and DeepSpeed's loaders read it).
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

from accel_train.checkpoint_io import CheckpointIO

__all__ = ["DEEPSPEED_CHECKPOINT_GLOBALS", "DeepSpeedCheckpointIO", "check_world_size"]

#: ``(module, name)`` of the DeepSpeed types its ZeRO 0-3 checkpoint files hold (found in the files DeepSpeed
#: 0.19 writes, with and without offload): the fp16 loss scalers (plain attribute holders), the ZeRO stage
#: enum and the address record of a parameter fragment (a dataclass).
DEEPSPEED_CHECKPOINT_GLOBALS: tuple[tuple[str, str], ...] = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _resolve(entries: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
    found = []
    for module, name in entries:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue  # another DeepSpeed version: a file naming it is refused
    return tuple(found)


class DeepSpeedCheckpointIO(CheckpointIO):
    """:class:`CheckpointIO` whose file checks also allow DeepSpeed's own checkpoint types."""

    def check_file(self, path: str) -> None:
        """Refuse a ``.pt`` file naming any global but tensors, plain values and DeepSpeed's checkpoint types."""
        from accel_train.checkpoint_safety import check_torch_file

        check_torch_file(path, _resolve(DEEPSPEED_CHECKPOINT_GLOBALS))


_PARTITION_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def check_world_size(tag_dir: str, world_size: int | None) -> None:
    """Refuse, before DeepSpeed reads anything, a ZeRO checkpoint partitioned over another number of
    data-parallel processes (DeepSpeed's partitioned optimizer files load only on the same number).

    Args:
        tag_dir: the engine's checkpoint folder (``pytorch_model``).
        world_size: the data-parallel size of this run's engine (``None``: no optimizer is loaded).

    Raises:
        ValueError: the folder holds optimizer partitions of another number of processes.
    """
    if world_size is None or not os.path.isdir(tag_dir):
        return
    ranks = {int(m.group(1)) for m in map(_PARTITION_RE.match, os.listdir(tag_dir)) if m}
    if ranks and len(ranks) != world_size:
        raise ValueError(
            f"{tag_dir} holds ZeRO optimizer partitions of {len(ranks)} processes, and this run has {world_size}; "
            "DeepSpeed loads them only on the same number of processes. Resume on "
            f"{len(ranks)} processes, or convert the checkpoint with DeepSpeed's ds_to_universal.py first."
        )

"""How accel reads a DeepSpeed engine's checkpoint without letting it run code.

DeepSpeed's ``engine.load_checkpoint`` reads its files (``mp_rank_00_model_states.pt``,
``zero_pp_rank_{r}_mp_rank_00_optim_states.pt``, ...) with ``torch.load(weights_only=False)``. Before it
runs, accel checks every ``.pt`` file of the tag folder with ``torch.load(weights_only=True)`` onto the
``meta`` device (no tensor bytes are read), allowing only the few DeepSpeed types these files hold
(`DEEPSPEED_CHECKPOINT_GLOBALS`); any other Python global is refused with
`UnsafeCheckpointError` and nothing is loaded. The layout stays
DeepSpeed's own (``zero_to_fp32.py`` and DeepSpeed's loaders read it).

A checkpoint partitioned over another number of data-parallel processes loads through DeepSpeed's
universal checkpoint, converted next to it and checked the same way before the engine reads it
(`reshard`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from accel_train.checkpoint.file_io import CheckpointIO

__all__ = ["DEEPSPEED_CHECKPOINT_GLOBALS", "DeepSpeedCheckpointIO"]

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
    """`CheckpointIO` whose file checks also allow DeepSpeed's own checkpoint types."""

    def check_file(self, path: str) -> None:
        """Refuse a ``.pt`` file naming any global but tensors, plain values and DeepSpeed's checkpoint types."""
        from accel_train.checkpoint.safety import check_torch_file

        check_torch_file(path, _resolve(DEEPSPEED_CHECKPOINT_GLOBALS))

    def load_engine(self, engine: Any, folder: str, tag: str, strict: bool = True) -> None:
        """Read ``folder/tag`` into the engine; written by another number of data-parallel processes, it goes
        through DeepSpeed's universal checkpoint first (`load_resharded()`).

        Args:
            engine: the ``DeepSpeedEngine`` to load into.
            folder: the ``save_state`` folder (checked with the allow-list already).
            tag: the engine's folder inside it.
            strict: every model key must match.
        """
        from accel_train.checkpoint.deepspeed_universal import load_resharded, saved_world_size

        saved = saved_world_size(os.path.join(folder, tag))
        current = getattr(engine, "seq_dp_world_size", None) or engine.dp_world_size
        if engine.optimizer is None or saved in (None, current):
            super().load_engine(engine, folder, tag, strict=strict)
            return
        load_resharded(
            engine,
            folder,
            tag,
            self.check_file,
            _resolve(DEEPSPEED_CHECKPOINT_GLOBALS),
            super().load_engine,
            is_main_process=_is_main_process(),
            strict=strict,
        )


def _is_main_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0

"""The full fp32 weights of a DeepSpeed ZeRO checkpoint, for ``accel merge-weights``.

DeepSpeed's own reader (``deepspeed.utils.zero_to_fp32``) joins the fp32 partitions of every process and
reads its files with ``torch.load(weights_only=False)``: every ``.pt`` file of the engine's folder is
checked with accel's allow-list (`DeepSpeedCheckpointIO`) before it runs.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from accel_state.install_hints import install_hint
from accel_train.checkpoint.layout import is_engine_folder

__all__ = ["deepspeed_engine_dir", "read_deepspeed_weights"]


def deepspeed_engine_dir(checkpoint_dir: str) -> str | None:
    """The DeepSpeed engine folder of ``checkpoint_dir``: itself, or the ``pytorch_model`` folder of a
    ``save_state`` folder; ``None`` when it holds neither (or only a frozen ZeRO-3 model's weights).

    Args:
        checkpoint_dir: a ``save_state`` folder or an engine's checkpoint folder.
    """
    from accel_train.checkpointing import FILE_NAMES, model_file

    for candidate in (checkpoint_dir, os.path.join(checkpoint_dir, FILE_NAMES["engine"])):
        if is_engine_folder(candidate):
            return candidate
        if os.path.isfile(os.path.join(candidate, model_file(0, True))) and os.path.basename(
            os.path.normpath(candidate)
        ).startswith(FILE_NAMES["engine"]):
            return candidate  # a frozen ZeRO-3 model: accel wrote its gathered weights there
    return None


def read_deepspeed_weights(engine_dir: str) -> dict[str, Any]:
    """Every weight of the DeepSpeed checkpoint in ``engine_dir`` as one full fp32 state dict.

    Args:
        engine_dir: the engine's checkpoint folder (from `deepspeed_engine_dir()`).

    Raises:
        UnsafeCheckpointError: a file of the folder names a global outside the allow-list, or the folder holds
            a DCP ``.metadata`` (nothing was read).
        ImportError: DeepSpeed is not installed (its reader joins the partitions).
    """
    from accel_train.checkpoint.deepspeed_io import DeepSpeedCheckpointIO
    from accel_train.checkpoint.layout import engine_torch_files
    from accel_train.checkpointing import model_file

    checker = DeepSpeedCheckpointIO()
    for relative in engine_torch_files(engine_dir):  # refuses a DCP .metadata planted beside them
        checker.check_file(os.path.join(engine_dir, relative))
    if not is_engine_folder(engine_dir):
        return checker.load_weights(os.path.join(engine_dir, model_file(0, True)), "cpu")
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as error:
        raise ImportError(
            f"{engine_dir} is a DeepSpeed checkpoint; merging it needs DeepSpeed: "
            f"{install_hint('accel-train', 'deepspeed')}"
        ) from error
    parent, tag = os.path.split(os.path.normpath(os.path.abspath(engine_dir)))
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every parameter
        state = get_fp32_state_dict_from_zero_checkpoint(parent, tag=tag)
    return {name: tensor.contiguous() for name, tensor in state.items()}

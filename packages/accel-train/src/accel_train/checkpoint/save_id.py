"""The id of one ``save_state`` call, and the files that carry it.

Every save gets one random id, the same on every process of that save: process 0's partial-folder token
(`accel_train.checkpoint.folder.new_save_token`, handed to every process when the save begins), recorded in the
manifest (``save_id``) and in the header metadata of the safetensors files the save writes (random states,
accumulated gradients, model weights, per-process shards) under `SAVE_ID_KEY`. ``torch.save`` files, DCP
folders and DeepSpeed's files keep their formats and carry no id. A folder whose files name two different
saves was mixed by hand (files copied in from another checkpoint): ``accel checkpoint inspect`` says so.

While a save writes, the id is in a context variable (`writing_as()`), so the writers of every strategy add
it without being passed it. This module imports no torch: reading a file's id reads its header only.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import struct
from collections.abc import Iterator

__all__ = ["SAVE_ID_KEY", "current_save_id", "header_save_id", "with_save_id", "writing_as"]

#: The header metadata key of a safetensors file that holds the id of the save that wrote it.
SAVE_ID_KEY = "accel_save_id"

#: A safetensors header larger than this is not read for its id (a damaged length; the checks name it).
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("accel_save_id", default=None)


def current_save_id() -> str | None:
    """The id of the save writing in this context (`None` outside a save)."""
    return _current.get()


@contextlib.contextmanager
def writing_as(save_id: str | None) -> Iterator[None]:
    """Mark the files written in the block as written by the save ``save_id`` (`None`: unmarked)."""
    token = _current.set(save_id or None)
    try:
        yield
    finally:
        _current.reset(token)


def with_save_id(metadata: dict[str, str]) -> dict[str, str]:
    """``metadata`` of a safetensors header, with the current save's id added when a save is writing."""
    save_id = _current.get()
    return metadata if save_id is None else {**metadata, SAVE_ID_KEY: save_id}


def header_save_id(path: str) -> str | None:
    """The save id in the header of the safetensors file ``path``; `None` when it has none, or when the
    file is no readable safetensors file (the file checks report that, not this).

    Args:
        path: a ``.safetensors`` file.
    """
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                return None
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER_BYTES:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    value = metadata.get(SAVE_ID_KEY) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None

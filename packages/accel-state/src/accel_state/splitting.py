"""Pure arithmetic of ``split_between_processes``: which slice of the inputs each process gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def share_bounds(length: int, num_processes: int, process_index: int) -> tuple[int, int]:
    """``(start, end)`` of this process's contiguous share; the first ``length % n`` shares get one more."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}")
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index {process_index} is outside 0..{num_processes - 1}")
    base, extra = divmod(length, num_processes)
    start = process_index * base + min(process_index, extra)
    end = start + base + (1 if process_index < extra else 0)
    return start, end


def _length(inputs: Any) -> int:
    if isinstance(inputs, Mapping):
        lengths = {key: len(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes needs values of one length; got lengths {lengths}")
        return next(iter(lengths.values()), 0)
    return len(inputs)


def _take(inputs: Any, start: int, end: int, pad_to: int) -> Any:
    if isinstance(inputs, Mapping):
        return type(inputs)({key: _take(value, start, end, pad_to) for key, value in inputs.items()})  # type: ignore[call-arg]
    piece = inputs[start:end]
    missing = pad_to - (end - start)
    if missing <= 0 or len(inputs) == 0:
        return piece
    if _is_tensor(inputs):
        import torch

        filler = (piece[-1:] if len(piece) else inputs[-1:]).expand(missing, *inputs.shape[1:])
        return torch.cat([piece, filler], dim=0)
    last = piece[-1] if len(piece) else inputs[-1]
    if isinstance(piece, list):
        return piece + [last] * missing
    if isinstance(piece, tuple):
        return piece + (last,) * missing
    return piece


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "shape")


def split_for_process(inputs: Any, num_processes: int, process_index: int, apply_padding: bool = False) -> Any:
    """This process's share of ``inputs`` (list, tuple, tensor, or a mapping of those)."""
    if num_processes == 1:
        return inputs
    length = _length(inputs)
    start, end = share_bounds(length, num_processes, process_index)
    pad_to = share_bounds(length, num_processes, 0)[1] if apply_padding else 0
    return _take(inputs, start, end, pad_to)

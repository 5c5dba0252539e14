"""Cutting a model into pipeline stages: contiguous runs of the children of an ``nn.Sequential``.

A stage keeps the children's own names (``"3"``, ``"head"``), so the names of its parameters are the
names they have in the whole model: checkpoints of the stages join into the whole model's state dict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["stage_bounds", "stage_module"]


def _children(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    if not isinstance(model, torch.nn.Sequential):
        raise TypeError(
            f"pipeline parallelism splits an nn.Sequential into stages (contiguous runs of its children); got "
            f"{type(model).__name__}. Write the model as nn.Sequential(embedding, *blocks, head) so that its "
            "forward is its children in order"
        )
    return list(model.named_children())


def stage_bounds(model: torch.nn.Module, num_stages: int, split_points: Sequence[int] | None = None) -> list[int]:
    """Child index where each stage begins, plus the number of children (``num_stages + 1`` values).

    Without ``split_points`` the cut balances the stages' parameter counts (each stage gets at least
    one child).

    Raises:
        TypeError: the model is not an ``nn.Sequential``.
        ValueError: fewer children than stages, or ``split_points`` of the wrong length or range.
    """
    children = _children(model)
    count = len(children)
    if count < num_stages:
        raise ValueError(f"the model has {count} children and cannot be split into {num_stages} pipeline stages")
    if split_points is not None:
        points = list(split_points)
        if len(points) != num_stages - 1 or (points and points[-1] >= count):
            raise ValueError(
                f"split_points={points} must give {num_stages - 1} increasing child indices in 1..{count - 1}"
            )
        return [0, *points, count]
    sizes = [sum(p.numel() for p in child.parameters()) for _, child in children]
    total = sum(sizes) or 1
    bounds = [0]
    running = 0
    for index, size in enumerate(sizes):
        stage = len(bounds)
        if stage == num_stages:
            break
        running += size
        # Leave at least one child for each stage still to come.
        left = count - (index + 1)
        if running >= total * stage / num_stages or left == num_stages - stage:
            bounds.append(index + 1)
    bounds.append(count)
    return bounds


def stage_module(model: torch.nn.Module, bounds: Sequence[int], stage: int) -> torch.nn.Sequential:
    """The children of stage ``stage`` (the same module objects) as an ``nn.Sequential`` keeping their names."""
    children = _children(model)
    return torch.nn.Sequential(OrderedDict(children[bounds[stage] : bounds[stage + 1]]))

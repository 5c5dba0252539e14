"""Settings of pipeline parallelism, parsed once into typed values (no torch import)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PipelineParallelConfig", "PipelineSchedule"]


class PipelineSchedule(str, enum.Enum):
    """The order in which micro-batches go forward and backward through the stages."""

    #: All forwards, then all backwards (``torch.distributed.pipelining.ScheduleGPipe``).
    GPIPE = "gpipe"
    #: One forward, one backward in steady state: less activation memory (``Schedule1F1B``).
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: Any) -> PipelineSchedule:
        """The schedule named by ``value`` (case-insensitive: ``"GPipe"``, ``"1F1B"``).

        Raises:
            ValueError: naming the value and the schedules there are.
        """
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower()
        for member in cls:
            if member.value == text:
                return member
        raise ValueError(f"pipeline schedule {value!r} is not known; choose one of {[m.value for m in cls]}")


@dataclass
class PipelineParallelConfig:
    """How the pipeline runs (the ``pp_handler`` of ``ParallelismConfig``).

    Args:
        schedule: ``"1f1b"`` (default) or ``"gpipe"``.
        num_microbatches: micro-batches each batch is split into (default: the number of stages); the
            batch size must be a multiple of it.
        loss_fn: ``loss_fn(output, target) -> scalar`` computed on the last stage for each micro-batch
            (a mean over the micro-batch, so that the mean over micro-batches is the batch's loss). It
            can also be given when calling the prepared model (``model(x, target=y, loss_fn=...)``).
        split_points: indices of the model's children where stages 1, 2, ... begin (``pp_size - 1``
            increasing indices); default: the children divided as evenly as possible by parameter count.
    """

    schedule: str | PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    num_microbatches: int | None = None
    loss_fn: Callable[..., Any] | None = None
    split_points: Sequence[int] | None = None

    def __post_init__(self) -> None:
        self.schedule = PipelineSchedule.parse(self.schedule)
        value = self.num_microbatches
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"PipelineParallelConfig.num_microbatches must be an int >= 1, got {value!r}")
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise TypeError(f"PipelineParallelConfig.loss_fn must be callable, got {type(self.loss_fn).__name__}")
        if self.split_points is not None:
            points = list(self.split_points)
            if not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in points) or points != sorted(
                set(points)
            ):
                raise ValueError(
                    f"PipelineParallelConfig.split_points must be increasing child indices > 0, got {points!r}"
                )
            self.split_points = points

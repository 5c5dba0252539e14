"""Pipeline-parallel training: a model split into stages over the ``pp`` dimension of the mesh.

`PipelineParallelConfig` (the ``pp_handler`` of ``ParallelismConfig``) holds the schedule and
micro-batch count; the strategy (`strategy`, registered as ``pipeline``) builds the stages with
``torch.distributed.pipelining`` and averages gradients over the data-parallel dimension. Importing
this package imports no torch.
"""

from __future__ import annotations

from accel_train.strategies.pipeline.config import PipelineParallelConfig, PipelineSchedule

__all__ = ["PipelineParallelConfig", "PipelineSchedule"]
